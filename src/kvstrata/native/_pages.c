/* kvstrata.native._pages: whether memory is resident (mincore(2)), for the SSD tier's reads on the event loop
 * (kvstrata/engine/tiers/resident.py, which falls back to numpy and ctypes without this module).
 *
 * One call per record read: in Python the same check costs ~14 us (numpy for the buffer's address, ctypes for the
 * call), more than copying a 16 KB record; here it is one system call. The SSD tier checks a record's pages by
 * their address, remembered from an earlier read, before it looks the record up: the lookup itself (py-lmdb)
 * touches every page of the value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define STACK_PAGES 256

/* Whether [addr, addr + len) is resident; a failed mincore (memory not mapped) answers 0. */
static int range_resident(uintptr_t start, size_t len) {
    if (len == 0)
        return 1;
    static long page = 0;
    if (page == 0)
        page = sysconf(_SC_PAGESIZE);
    uintptr_t first = start - start % (uintptr_t)page;
    size_t pages = (size_t)((start + len - first + (uintptr_t)page - 1) / (uintptr_t)page);
    unsigned char stack[STACK_PAGES];
    unsigned char *vec = pages <= STACK_PAGES ? stack : malloc(pages);
    int ok = 0;
    if (vec != NULL && mincore((void *)first, pages * (size_t)page, vec) == 0) {
        ok = 1;
        for (size_t i = 0; i < pages; i++) {
            if (!(vec[i] & 1)) { /* only the low bit is defined: the page is resident */
                ok = 0;
                break;
            }
        }
    }
    if (vec != stack)
        free(vec);
    return ok;
}

static PyObject *pages_resident(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    int ok = range_resident((uintptr_t)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

static PyObject *pages_resident_at(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "resident_at(address, length)");
        return NULL;
    }
    unsigned long long addr = PyLong_AsUnsignedLongLong(args[0]);
    if (addr == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t len = PyLong_AsSsize_t(args[1]);
    if (len < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "negative length");
        return NULL;
    }
    return PyBool_FromLong(range_resident((uintptr_t)addr, (size_t)len));
}

static PyObject *pages_address(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *out = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)view.buf);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"resident", pages_resident, METH_O,
     "resident(buffer) -> bool: whether every page under the buffer is in memory (a failed mincore: False)."},
    {"resident_at", (PyCFunction)(void (*)(void))pages_resident_at, METH_FASTCALL,
     "resident_at(address, length) -> bool: resident() of a range of this process's memory, which need not be "
     "mapped (then False)."},
    {"address", pages_address, METH_O, "address(buffer) -> int: where the buffer's first byte lies."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvstrata.native._pages", "Page residency of buffers (mincore).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pages(void) { return PyModule_Create(&module); }
