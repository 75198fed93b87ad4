/* Large copies with non-temporal (streaming) stores, for the client's restore and staging copies.
 *
 * An ordinary copy of a buffer larger than the caches moves three bytes of memory traffic per byte copied: the
 * source is read, each destination line is read for ownership before it is written, and written back later.
 * Streaming stores skip the read for ownership (the line goes from a write-combining buffer to memory whole):
 * two bytes per byte. glibc's memcpy does this itself for one copy at or above
 * glibc.cpu.x86_non_temporal_threshold (tens of MB on real hosts), never for the 64 KB runs a restore is made of.
 *
 * Built into a plain shared library at install time (hatch_build.py) and called through ctypes
 * (kvstrata/native/ntcopy.py), which releases the GIL for the call. No Python headers, no run-time compiling.
 * The AVX2 loop is compiled with a target attribute, not -mavx2, so one build runs on any x86-64 and picks its
 * loop on load (__builtin_cpu_supports); SSE2, which every x86-64 has, is the fallback. Elsewhere the library
 * reports level 0 and the Python side does not use it.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVS_X86 1
#include <immintrin.h>
#endif

#define KVS_ALIGN 64  /* the destination of the streamed part starts on a cache line: whole lines, no partial */
#define KVS_BLOCK 128 /* bytes per loop iteration: two cache lines */
#define KVS_MAX_DIMS 32

typedef void (*body_fn)(char *d, const char *s, size_t blocks);

#ifdef KVS_X86
__attribute__((target("avx2"))) static void body_avx2(char *d, const char *s, size_t blocks) {
    for (; blocks; blocks--, d += KVS_BLOCK, s += KVS_BLOCK) {
        /* unaligned loads: an arena value's payload follows its header at any offset */
        __m256i a = _mm256_loadu_si256((const __m256i *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
        _mm256_stream_si256((__m256i *)d, a);
        _mm256_stream_si256((__m256i *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(d + 64), c);
        _mm256_stream_si256((__m256i *)(d + 96), e);
    }
}

static void body_sse2(char *d, const char *s, size_t blocks) {
    for (; blocks; blocks--, d += KVS_BLOCK, s += KVS_BLOCK) {
        __m128i r[8];
        for (int k = 0; k < 8; k++) r[k] = _mm_loadu_si128((const __m128i *)(s + 16 * k));
        for (int k = 0; k < 8; k++) _mm_stream_si128((__m128i *)(d + 16 * k), r[k]);
    }
}

static int best_level(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 2 : 1;
}
#else
static void body_plain(char *d, const char *s, size_t blocks) { memcpy(d, s, blocks * KVS_BLOCK); }
static int best_level(void) { return 0; }
#endif

static body_fn body;
static int level;

/* The loop in use: 2 AVX2, 1 SSE2, 0 none (not x86-64: plain memcpy, which the Python side does not call).
 * want < 0: the best this CPU has; otherwise at most want (the tests run both loops). Returns the level set.
 * Called once by the loader before any copy; a later call while copies run on other threads is not supported. */
int kvs_nt_select(int want) {
    int best = best_level();
    level = (want < 0 || want > best) ? best : want;
#ifdef KVS_X86
    body = level == 2 ? body_avx2 : body_sse2;
    if (level == 0) level = 1; /* SSE2 is the floor on x86-64 */
#else
    body = body_plain;
#endif
    return level;
}

__attribute__((constructor)) static void kvs_init(void) { kvs_nt_select(-1); }

static inline void run(char *d, const char *s, size_t n) {
    size_t head = (size_t)(-(uintptr_t)d) & (KVS_ALIGN - 1);
    if (n < head + KVS_BLOCK) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head); /* ordinary stores up to the first whole cache line ... */
    d += head, s += head, n -= head;
    size_t blocks = n / KVS_BLOCK;
    body(d, s, blocks);
    memcpy(d + blocks * KVS_BLOCK, s + blocks * KVS_BLOCK, n - blocks * KVS_BLOCK); /* ... and after the last */
}

static inline void fence(void) {
#ifdef KVS_X86
    /* Streaming stores are weakly ordered: make them visible before the caller tells anyone (another thread, the
     * server through a socket, a DMA engine) that the bytes are there. */
    _mm_sfence();
#endif
}

/* n bytes from src to dst (not overlapping). */
void kvs_nt_copy(void *dst, const void *src, size_t n) {
    run((char *)dst, (const char *)src, n);
    fence();
}

/* A strided copy: ndim outer axes of shape[k] elements, dst_strides[k] and src_strides[k] bytes apart (any sign),
 * each element a contiguous run of run_bytes in both. Returns 0, or -1 for more than KVS_MAX_DIMS axes
 * (nothing copied). */
int kvs_nt_copy_strided(char *dst, const char *src, int ndim, const ptrdiff_t *shape, const ptrdiff_t *dst_strides,
                        const ptrdiff_t *src_strides, size_t run_bytes) {
    ptrdiff_t idx[KVS_MAX_DIMS];
    if (ndim < 0 || ndim > KVS_MAX_DIMS) return -1;
    for (int k = 0; k < ndim; k++) {
        if (shape[k] <= 0) return 0;
        idx[k] = 0;
    }
    for (;;) {
        run(dst, src, run_bytes);
        int k = ndim - 1; /* next element in C order: carry from the last axis */
        for (; k >= 0; k--) {
            dst += dst_strides[k], src += src_strides[k];
            if (++idx[k] < shape[k]) break;
            dst -= dst_strides[k] * shape[k], src -= src_strides[k] * shape[k];
            idx[k] = 0;
        }
        if (k < 0) break;
    }
    fence();
    return 0;
}
