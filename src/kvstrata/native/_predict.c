/* The predictor's per-access work in C: kvstrata.engine.predict.Predictor's hot path, compiled.
 *
 * kvstrata.engine.predict.PurePredictor is the definition; this module makes the same predictions from the same
 * state, step for step (tests/unit/test_predict_native.py replays traces through both and compares every
 * prediction, expected use and profile array). It provides:
 *
 *   Lane, Stream: the predictor's per-stream state as C structs, every field visible to Python as an attribute
 *   of the same name (the pure methods that stay in Python, such as expect and forget_stream, use them);
 *   Core: a base class holding the predictor's state, and read, write, take, _drain, _grow and _reach in C.
 *
 * kvstrata.engine.predict builds Predictor from Core and PurePredictor (Core first, so its methods win). The
 * profile table stays a Python AccessProfiles; assigning Core._profiles binds its arrays' buffers here, so both
 * languages work on the same memory. Its rare operations (allocating a slot for a new key) are called in Python.
 *
 * Why C: on two shared vCPUs the Python hot path cost 5-10 us per DRAM-hit GET, against a 3 us target (issue 19).
 * Every float is computed in double and stored as the arrays store it, in the same order as the Python code, so
 * the two agree bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>

#define LANES_PER_STREAM 16
#define LINK_MIN 16
#define FAMILIES_MAX 65536
#define LOG_MAX 4096
#define COUNT_MAX 0xFFFF
#define BRANCH 1
#define BOUNDARY 2
#define HEAD 4
#define PRIOR_WEIGHT 2.0

static PyObject *s_tick, *s_horizon, *s_half_life, *s_cont, *s_stop, *s_prior_cont, *s_prior_stop, *s_slot,
    *s_forget, *s_slots, *s_keys, *s_family, *s_interior, *s_boundary;

/* ---- Lane ---- */
typedef struct {
    PyObject_HEAD
    PyObject *fam;
    long prev;
    unsigned int prev_gen;
    char prev_read;
    long long tick;
    PyObject *ahead;
    PyObject *probs;
    double prob;
    long sent;
    long budget;
    char stuck;
    PyObject *hold;
    long streak;
    long extra;
    long low;
} Lane;

static PyTypeObject LaneType;

static Lane *lane_new_fam(PyObject *fam) {
    Lane *l = PyObject_New(Lane, &LaneType);
    if (!l) return NULL;
    l->ahead = PyList_New(0);
    l->probs = PyList_New(0);
    if (!l->ahead || !l->probs) {
        Py_XDECREF(l->ahead);
        Py_XDECREF(l->probs);
        l->ahead = l->probs = NULL;
        l->fam = NULL;
        l->hold = NULL;
        Py_DECREF(l);
        return NULL;
    }
    Py_INCREF(fam);
    l->fam = fam;
    l->prev = -1;
    l->prev_gen = 0;
    l->prev_read = 0;
    l->tick = 0;
    l->prob = 1.0;
    l->sent = 0;
    l->budget = 0;
    l->stuck = 0;
    Py_INCREF(Py_None);
    l->hold = Py_None;
    l->streak = 0;
    l->extra = 0;
    l->low = -1;
    return l;
}

static PyObject *Lane_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"fam", NULL};
    PyObject *fam = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|S", kwlist, &fam)) return NULL;
    if (fam == NULL) {
        PyObject *empty = PyBytes_FromStringAndSize("", 0);
        if (!empty) return NULL;
        Lane *l = lane_new_fam(empty);
        Py_DECREF(empty);
        return (PyObject *)l;
    }
    return (PyObject *)lane_new_fam(fam);
}

static void Lane_dealloc(Lane *l) {
    Py_XDECREF(l->fam);
    Py_XDECREF(l->ahead);
    Py_XDECREF(l->probs);
    Py_XDECREF(l->hold);
    PyObject_Free(l);
}

static PyMemberDef Lane_members[] = {
    {"fam", T_OBJECT_EX, offsetof(Lane, fam), 0, NULL},
    {"prev", T_LONG, offsetof(Lane, prev), 0, NULL},
    {"prev_gen", T_UINT, offsetof(Lane, prev_gen), 0, NULL},
    {"prev_read", T_BOOL, offsetof(Lane, prev_read), 0, NULL},
    {"tick", T_LONGLONG, offsetof(Lane, tick), 0, NULL},
    {"ahead", T_OBJECT_EX, offsetof(Lane, ahead), 0, NULL},
    {"probs", T_OBJECT_EX, offsetof(Lane, probs), 0, NULL},
    {"prob", T_DOUBLE, offsetof(Lane, prob), 0, NULL},
    {"sent", T_LONG, offsetof(Lane, sent), 0, NULL},
    {"budget", T_LONG, offsetof(Lane, budget), 0, NULL},
    {"stuck", T_BOOL, offsetof(Lane, stuck), 0, NULL},
    {"hold", T_OBJECT, offsetof(Lane, hold), 0, NULL},
    {"streak", T_LONG, offsetof(Lane, streak), 0, NULL},
    {"extra", T_LONG, offsetof(Lane, extra), 0, NULL},
    {"low", T_LONG, offsetof(Lane, low), 0, NULL},
    {NULL}
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvstrata.native._predict.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A stream's walk along one key family (kvstrata.engine.predict._Lane, in C).",
    .tp_new = Lane_tp_new,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_members = Lane_members,
};

/* A lane waits past an untested link (``hold`` is a key; None or deleted: it does not) */
#define HOLDS(l) ((l)->hold != NULL && (l)->hold != Py_None)

/* A Lane's list fields are only ever lists (Python assigns new lists): checked where C indexes them. */
static int lane_lists_ok(Lane *l) {
    if (!l->ahead || !PyList_CheckExact(l->ahead) || !l->probs || !PyList_CheckExact(l->probs)) {
        PyErr_SetString(PyExc_TypeError, "Lane.ahead and Lane.probs must be lists");
        return 0;
    }
    return 1;
}

/* ---- Stream ---- */
typedef struct {
    PyObject_HEAD
    PyObject *lanes;
    PyObject *hot;
    double gap;
    long long tick;
} Stream;

static PyTypeObject StreamType;

static Stream *stream_new_gap(double gap) {
    Stream *st = PyObject_New(Stream, &StreamType);
    if (!st) return NULL;
    st->lanes = PyDict_New();
    if (!st->lanes) {
        st->hot = NULL;
        Py_DECREF(st);
        return NULL;
    }
    Py_INCREF(Py_None);
    st->hot = Py_None;
    st->gap = gap;
    st->tick = 0;
    return st;
}

static PyObject *Stream_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"gap", NULL};
    double gap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d", kwlist, &gap)) return NULL;
    return (PyObject *)stream_new_gap(gap);
}

static void Stream_dealloc(Stream *st) {
    Py_XDECREF(st->lanes);
    Py_XDECREF(st->hot);
    PyObject_Free(st);
}

static PyMemberDef Stream_members[] = {
    {"lanes", T_OBJECT_EX, offsetof(Stream, lanes), 0, NULL},
    {"hot", T_OBJECT, offsetof(Stream, hot), 0, NULL},
    {"gap", T_DOUBLE, offsetof(Stream, gap), 0, NULL},
    {"tick", T_LONGLONG, offsetof(Stream, tick), 0, NULL},
    {NULL}
};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvstrata.native._predict.Stream",
    .tp_basicsize = sizeof(Stream),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One client stream's lanes (kvstrata.engine.predict._Stream, in C).",
    .tp_new = Stream_tp_new,
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_members = Stream_members,
};

/* ---- Core ---- */
enum { A_LAST, A_TICK_AT, A_HEAT, A_IVAL, A_PRED, A_PRED_GEN, A_NEXT, A_NEXT_GEN, A_GEN, A_CONT, A_STOP, A_FLAGS,
       A_REF, A_N };
static const char *ARRAY_NAMES[A_N] = {"last", "tick_at", "heat", "ival", "pred", "pred_gen", "next", "next_gen",
                                       "gen", "cont", "stop", "flags", "ref"};
static const char ARRAY_FORMATS[A_N] = {'d', 'q', 'f', 'f', 'i', 'I', 'i', 'I', 'I', 'H', 'H', 'B', 'B'};
static const Py_ssize_t ARRAY_SIZES[A_N] = {8, 8, 4, 4, 4, 4, 4, 4, 4, 2, 2, 1, 1};

typedef struct {
    PyObject_HEAD
    /* the profile table (AccessProfiles) and its arrays */
    PyObject *profiles;
    Py_buffer bufs[A_N];
    int bound;
    Py_ssize_t max_keys;
    PyObject *slots, *keys, *family, *interior, *boundary;
    double *last;
    long long *tick_at;
    float *heat, *ival;
    int32_t *pred, *next;
    uint32_t *pred_gen, *next_gen, *gen;
    uint16_t *cont, *stop;
    uint8_t *flags, *ref;
    /* the predictor's state (PurePredictor's attributes of the same names) */
    PyObject *log, *streams, *dirty, *due, *announced, *families, *resident, *now;
    char pending, short_path;
    double gap, survival, min_confidence, link_window;
    long window, session_max, max_streams, trust_streak, trust_ahead, refill;
    long walks, session_walks, lookups, expects, due_max;
} Core;

static void core_unbind(Core *c) {
    if (c->bound) {
        for (int i = 0; i < A_N; i++) PyBuffer_Release(&c->bufs[i]);
        c->bound = 0;
    }
    Py_CLEAR(c->slots);
    Py_CLEAR(c->keys);
    Py_CLEAR(c->family);
    Py_CLEAR(c->interior);
    Py_CLEAR(c->boundary);
    Py_CLEAR(c->profiles);
}

static int core_bind(Core *c, PyObject *p) {
    PyObject *slots = NULL, *keys = NULL, *family = NULL, *interior = NULL, *boundary = NULL;
    Py_buffer bufs[A_N];
    int got = 0;
    slots = PyObject_GetAttr(p, s_slots);
    keys = PyObject_GetAttr(p, s_keys);
    family = PyObject_GetAttr(p, s_family);
    interior = PyObject_GetAttr(p, s_interior);
    boundary = PyObject_GetAttr(p, s_boundary);
    if (!slots || !keys || !family || !interior || !boundary) goto fail;
    if (!PyDict_CheckExact(slots) || !PyList_CheckExact(keys) || !PyList_CheckExact(family)) {
        PyErr_SetString(PyExc_TypeError, "AccessProfiles: slots must be a dict, keys and family lists");
        goto fail;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(family) != n) {
        PyErr_SetString(PyExc_ValueError, "AccessProfiles: keys and family differ in length");
        goto fail;
    }
    for (got = 0; got < A_N; got++) {
        PyObject *arr = PyObject_GetAttrString(p, ARRAY_NAMES[got]);
        if (!arr) goto fail;
        int r = PyObject_GetBuffer(arr, &bufs[got], PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE);
        Py_DECREF(arr);
        if (r < 0) goto fail;
        if (bufs[got].itemsize != ARRAY_SIZES[got] || !bufs[got].format || bufs[got].format[0] != ARRAY_FORMATS[got]
            || bufs[got].format[1] != 0 || bufs[got].len != n * ARRAY_SIZES[got]) {
            PyErr_Format(PyExc_TypeError, "AccessProfiles.%s is not an array('%c') of %zd items",
                         ARRAY_NAMES[got], ARRAY_FORMATS[got], n);
            PyBuffer_Release(&bufs[got]);
            goto fail;
        }
    }
    core_unbind(c);
    memcpy(c->bufs, bufs, sizeof(bufs));
    c->bound = 1;
    c->max_keys = n;
    Py_INCREF(p);
    c->profiles = p;
    c->slots = slots;
    c->keys = keys;
    c->family = family;
    c->interior = interior;
    c->boundary = boundary;
    c->last = (double *)bufs[A_LAST].buf;
    c->tick_at = (long long *)bufs[A_TICK_AT].buf;
    c->heat = (float *)bufs[A_HEAT].buf;
    c->ival = (float *)bufs[A_IVAL].buf;
    c->pred = (int32_t *)bufs[A_PRED].buf;
    c->pred_gen = (uint32_t *)bufs[A_PRED_GEN].buf;
    c->next = (int32_t *)bufs[A_NEXT].buf;
    c->next_gen = (uint32_t *)bufs[A_NEXT_GEN].buf;
    c->gen = (uint32_t *)bufs[A_GEN].buf;
    c->cont = (uint16_t *)bufs[A_CONT].buf;
    c->stop = (uint16_t *)bufs[A_STOP].buf;
    c->flags = (uint8_t *)bufs[A_FLAGS].buf;
    c->ref = (uint8_t *)bufs[A_REF].buf;
    return 0;
fail:
    for (int i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    Py_XDECREF(slots);
    Py_XDECREF(keys);
    Py_XDECREF(family);
    Py_XDECREF(interior);
    Py_XDECREF(boundary);
    return -1;
}

static int core_ready(Core *c) {
    if (!c->bound || !c->log || !c->streams || !c->dirty || !c->due || !c->announced || !c->families
        || !c->resident || !c->now) {
        PyErr_SetString(PyExc_RuntimeError, "the predictor is not initialised");
        return 0;
    }
    if (!PyList_CheckExact(c->log) || !PyDict_CheckExact(c->streams) || !PyDict_CheckExact(c->dirty)
        || !PyDict_CheckExact(c->due) || !PyList_CheckExact(c->announced) || !PyDict_CheckExact(c->families)) {
        PyErr_SetString(PyExc_TypeError, "the predictor's log, streams, dirty, due, announced, families changed type");
        return 0;
    }
    return 1;
}

/* ---- small Python-attribute helpers ---- */
static int get_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *o, PyObject *name, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) return -1;
    int r = PyObject_SetAttr(o, name, x);
    Py_DECREF(x);
    return r;
}

static int get_d(PyObject *o, PyObject *name, double *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static int set_d(PyObject *o, PyObject *name, double v) {
    PyObject *x = PyFloat_FromDouble(v);
    if (!x) return -1;
    int r = PyObject_SetAttr(o, name, x);
    Py_DECREF(x);
    return r;
}

/* ClassStats.cont or .stop += 1 */
static int bump(PyObject *cls, PyObject *name) {
    long long v;
    if (get_ll(cls, name, &v) < 0) return -1;
    return set_ll(cls, name, v + 1);
}

/* (cont + prior_cont) / (cont + stop + prior_cont + prior_stop): ClassStats.prior, in the same order */
static int class_prior(PyObject *cls, double *out) {
    long long cont, stop;
    double pc, ps;
    if (get_ll(cls, s_cont, &cont) < 0 || get_ll(cls, s_stop, &stop) < 0 || get_d(cls, s_prior_cont, &pc) < 0
        || get_d(cls, s_prior_stop, &ps) < 0)
        return -1;
    *out = ((double)cont + pc) / ((((double)(cont + stop)) + pc) + ps);
    return 0;
}

static PyObject *dict_id_key(PyObject *o) { return PyLong_FromVoidPtr(o); }

static inline long py_floordiv(long a, long b) {
    long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}

/* the slot of ``key``, allocated by AccessProfiles.slot when it has none; -1 with an exception on error */
static long slot_of(Core *c, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(c->slots, key);
    if (v) {
        Py_INCREF(v);
    } else {
        if (PyErr_Occurred()) return -1;
        v = PyObject_CallMethodOneArg(c->profiles, s_slot, key);
        if (!v) return -1;
    }
    long s = PyLong_AsLong(v);
    Py_DECREF(v);
    if (s == -1 && PyErr_Occurred()) return -1;
    if (s < 0 || s >= c->max_keys) {
        PyErr_SetString(PyExc_IndexError, "profile slot out of range");
        return -1;
    }
    return s;
}

/* ---- AccessProfiles.outcome and .link on the arrays ---- */
static int outcome(Core *c, long s, int continued) {
    uint8_t f = c->flags[s];
    if (continued) {
        if (c->cont[s] < COUNT_MAX) c->cont[s]++;
    } else if (c->stop[s] < COUNT_MAX) {
        c->stop[s]++;
    }
    if (!(f & BRANCH)) {
        PyObject *cls = (f & BOUNDARY) ? c->boundary : c->interior;
        return bump(cls, continued ? s_cont : s_stop);
    }
    return 0;
}

static inline long predecessor(Core *c, long s) {
    long q = c->pred[s];
    if (q < 0 || c->gen[q] != c->pred_gen[s]) return -1;
    return q;
}

static inline long successor(Core *c, long s) {
    long n = c->next[s];
    if (n < 0 || c->gen[n] != c->next_gen[s]) return -1;
    return n;
}

static int link_keys(Core *c, long s, long n) {
    if (n == s) return 0;
    long q = predecessor(c, n);
    if (q >= 0 && q != s) return 0;
    long current = successor(c, s);
    if (current >= 0 && current != n) {
        c->flags[s] |= BRANCH;
        c->flags[current] |= HEAD;
    }
    if (c->flags[s] & BRANCH) c->flags[n] |= HEAD;
    c->next[s] = (int32_t)n;
    c->next_gen[s] = c->gen[n];
    c->pred[n] = (int32_t)s;
    c->pred_gen[n] = c->gen[s];
    return 1;
}

/* ---- streams and lanes ---- */
static int forget(Core *c, PyObject *sid) {
    PyObject *r = PyObject_CallMethodOneArg((PyObject *)c, s_forget, sid);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* PurePredictor._stream: the stream's state, created (the oldest stream forgotten beyond max_streams) */
static Stream *get_stream(Core *c, PyObject *sid) {
    PyObject *st = PyDict_GetItemWithError(c->streams, sid);
    if (st) {
        if (!Py_IS_TYPE(st, &StreamType)) {
            PyErr_SetString(PyExc_TypeError, "a stream is not a kvstrata.native._predict.Stream");
            return NULL;
        }
        return (Stream *)st;
    }
    if (PyErr_Occurred()) return NULL;
    if (PyDict_GET_SIZE(c->streams) >= c->max_streams) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        if (PyDict_Next(c->streams, &pos, &k, &v)) {
            Py_INCREF(k);
            int r = forget(c, k);
            Py_DECREF(k);
            if (r < 0) return NULL;
        }
    }
    Stream *nst = stream_new_gap(c->gap);
    if (!nst) return NULL;
    int r = PyDict_SetItem(c->streams, sid, (PyObject *)nst);
    Py_DECREF(nst);
    return r < 0 ? NULL : nst;  /* borrowed: the dict holds it */
}

/* PurePredictor._lane: the stream's lane of ``fam``, created (its oldest lane dropped beyond LANES_PER_STREAM) */
static Lane *get_lane(Core *c, Stream *st, PyObject *fam) {
    if (!PyDict_CheckExact(st->lanes)) {
        PyErr_SetString(PyExc_TypeError, "Stream.lanes must be a dict");
        return NULL;
    }
    PyObject *lane = PyDict_GetItemWithError(st->lanes, fam);
    if (lane) {
        if (!Py_IS_TYPE(lane, &LaneType)) {
            PyErr_SetString(PyExc_TypeError, "a lane is not a kvstrata.native._predict.Lane");
            return NULL;
        }
        return (Lane *)lane;
    }
    if (PyErr_Occurred()) return NULL;
    if (PyDict_GET_SIZE(st->lanes) >= LANES_PER_STREAM) {
        Py_ssize_t pos = 0;
        PyObject *k, *old;
        if (PyDict_Next(st->lanes, &pos, &k, &old)) {
            Py_INCREF(k);
            Py_INCREF(old);
            int r = PyDict_DelItem(st->lanes, k);
            Py_DECREF(k);
            if (r < 0) {
                Py_DECREF(old);
                return NULL;
            }
            PyObject *id = dict_id_key(old);
            if (!id) {
                Py_DECREF(old);
                return NULL;
            }
            if (PyDict_DelItem(c->dirty, id) < 0) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                    Py_DECREF(id);
                    Py_DECREF(old);
                    return NULL;
                }
                PyErr_Clear();
            }
            Py_DECREF(id);
            if (st->hot == old) {
                Py_INCREF(Py_None);
                Py_SETREF(st->hot, Py_None);
            }
            Py_DECREF(old);
        }
    }
    Lane *l = lane_new_fam(fam);
    if (!l) return NULL;
    int r = PyDict_SetItem(st->lanes, fam, (PyObject *)l);
    Py_DECREF(l);
    return r < 0 ? NULL : l;
}

static int mark_dirty(Core *c, Lane *lane) {
    PyObject *id = dict_id_key((PyObject *)lane);
    if (!id) return -1;
    int r = PyDict_SetItem(c->dirty, id, (PyObject *)lane);
    Py_DECREF(id);
    return r;
}

/* ---- walks ---- */
static void set_low(Core *c, Lane *lane) {
    long cap = lane->budget;
    if (c->trust_ahead > 0 && lane->streak >= c->trust_streak) cap += c->trust_ahead;
    long r = py_floordiv(lane->budget, 2);
    if (r > c->refill) r = c->refill;
    lane->low = cap - (r > 1 ? r : 1);
}

/* PurePredictor._grow */
static int grow(Core *c, Lane *lane, long s, double prob) {
    if (!lane_lists_ok(lane)) return -1;
    PyObject *ahead = lane->ahead;
    long budget = lane->budget;
    long trust = lane->streak >= c->trust_streak ? c->trust_ahead : 0;
    if (trust) budget += trust;
    long extra = lane->extra;
    long seen = 0;
    double prior_in = 0.0, prior_bd = 0.0;
    int have_in = 0, have_bd = 0;
    while (PyList_GET_SIZE(ahead) < budget) {
        uint8_t f = c->flags[s];
        if (f & BRANCH) {
            lane->stuck = 1;
            return 0;
        }
        long n = c->next[s];
        if (n < 0 || c->gen[n] != c->next_gen[s] || n == s) {
            lane->stuck = 1;
            return 0;
        }
        /* AccessProfiles.link_score, inline; a class's prior does not change during a walk */
        int is_interior = !(f & BOUNDARY);
        double prior;
        if (is_interior) {
            if (!have_in) {
                if (class_prior(c->interior, &prior_in) < 0) return -1;
                have_in = 1;
            }
            prior = prior_in;
        } else {
            if (!have_bd) {
                if (class_prior(c->boundary, &prior_bd) < 0) return -1;
                have_bd = 1;
            }
            prior = prior_bd;
        }
        long cn = c->cont[s];
        double q = ((double)cn + PRIOR_WEIGHT * prior) / ((double)(cn + (long)c->stop[s]) + PRIOR_WEIGHT);
        if (is_interior) q = q >= c->min_confidence ? 1.0 : 0.0;
        if (extra || prob * q < c->min_confidence || HOLDS(lane)) {
            if (extra >= trust) return 0;
            extra += 1;
        }
        if (n >= c->max_keys) {
            PyErr_SetString(PyExc_IndexError, "profile slot out of range");
            return -1;
        }
        PyObject *key = PyList_GET_ITEM(c->keys, n);
        if (key == Py_None) {
            lane->stuck = 1;
            return 0;
        }
        lane->prob = prob = prob * q;
        if (PyList_Append(ahead, key) < 0) return -1;
        PyObject *qf = PyFloat_FromDouble(q);
        if (!qf) return -1;
        int r = PyList_Append(lane->probs, qf);
        Py_DECREF(qf);
        if (r < 0) return -1;
        lane->extra = extra;
        if (!cn) {
            Py_INCREF(key);
            Py_SETREF(lane->hold, key);
            if (!trust) return 0;
        }
        s = n;
        seen += 1;
        if (seen > c->session_max) {
            lane->stuck = 1;
            return 0;
        }
    }
    return 0;
}

/* PurePredictor._extend */
static int extend(Core *c, Lane *lane) {
    if (!lane_lists_ok(lane)) return -1;
    int trusted = c->trust_ahead > 0 && lane->streak >= c->trust_streak;
    if (HOLDS(lane)) {
        int in = PySequence_Contains(lane->ahead, lane->hold);
        if (in < 0) return -1;
        if (in) {
            if (!trusted) return 0;
        } else {
            Py_INCREF(Py_None);
            Py_SETREF(lane->hold, Py_None);
        }
    }
    if (lane->stuck || PyList_GET_SIZE(lane->ahead) >= lane->budget + (trusted ? c->trust_ahead : 0)) return 0;
    long s;
    double prob;
    Py_ssize_t n = PyList_GET_SIZE(lane->ahead);
    if (n) {
        PyObject *v = PyDict_GetItemWithError(c->slots, PyList_GET_ITEM(lane->ahead, n - 1));
        if (!v) {
            if (PyErr_Occurred()) return -1;
            lane->stuck = 1;
            return 0;
        }
        s = PyLong_AsLong(v);
        if (s == -1 && PyErr_Occurred()) return -1;
        if (s < 0) {
            lane->stuck = 1;
            return 0;
        }
        prob = lane->prob;
        if (prob < 0.0) {
            prob = 1.0;
            Py_ssize_t m = PyList_GET_SIZE(lane->probs);
            for (Py_ssize_t i = 0; i < m; i++) {
                double q = PyFloat_AsDouble(PyList_GET_ITEM(lane->probs, i));
                if (q == -1.0 && PyErr_Occurred()) return -1;
                prob *= q;
            }
            lane->prob = prob;
        }
    } else {
        s = lane->prev;
        prob = 1.0;
    }
    if (s < 0 || s >= c->max_keys) {
        PyErr_SetString(PyExc_IndexError, "profile slot out of range");
        return -1;
    }
    return grow(c, lane, s, prob);
}

/* PurePredictor._reach: (budget, returning) */
static int reach(Core *c, long s, long *budget_out, int *returning_out) {
    long nk = c->next[s];
    int returning = 0;
    if (nk >= 0 && nk < c->max_keys && c->gen[nk] == c->next_gen[s]) {
        int in = PySequence_Contains(c->resident, PyList_GET_ITEM(c->keys, nk));
        if (in < 0) return -1;
        returning = !in;
    }
    long budget = returning ? c->session_max : c->window;
    double sgap = c->gap > 1.0 ? c->gap : 1.0;
    int truthy = PyObject_IsTrue(c->resident);
    if (truthy < 0) return -1;
    double half = INFINITY;
    if (truthy) {
        Py_ssize_t len = PyObject_Size(c->resident);
        if (len < 0) return -1;
        half = (double)len / 2.0;
    }
    double m = half < c->survival ? half : c->survival;
    double r = m / sgap;
    if (r < (double)budget) {
        long ir = (long)r;
        budget = ir > 1 ? ir : 1;
    }
    *budget_out = budget;
    *returning_out = returning;
    return 0;
}

/* PurePredictor._walk */
static int walk(Core *c, Lane *lane, long s, long budget, int session) {
    c->walks += 1;
    if (session) c->session_walks += 1;
    PyObject *a = PyList_New(0), *p = PyList_New(0);
    if (!a || !p) {
        Py_XDECREF(a);
        Py_XDECREF(p);
        return -1;
    }
    Py_XSETREF(lane->ahead, a);
    Py_XSETREF(lane->probs, p);
    lane->prob = 1.0;
    lane->sent = 0;
    lane->budget = budget;
    lane->stuck = 0;
    Py_INCREF(Py_None);
    Py_XSETREF(lane->hold, Py_None);
    lane->streak = 0;
    lane->extra = 0;
    set_low(c, lane);
    return grow(c, lane, s, 1.0);
}

/* PurePredictor._slide */
static int slide(Core *c, Lane *lane, PyObject *key, long s) {
    if (!lane_lists_ok(lane)) return -1;
    PyObject *ahead = lane->ahead;
    Py_ssize_t n = PyList_GET_SIZE(ahead), idx = -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        int eq = PyObject_RichCompareBool(PyList_GET_ITEM(ahead, j), key, Py_EQ);
        if (eq < 0) return -1;
        if (eq) {
            idx = j;
            break;
        }
    }
    if (idx >= 0) {
        Py_ssize_t i = idx + 1;
        if (PyList_SetSlice(ahead, 0, i, NULL) < 0) return -1;
        Py_ssize_t np = PyList_GET_SIZE(lane->probs);
        if (PyList_SetSlice(lane->probs, 0, i < np ? i : np, NULL) < 0) return -1;
        lane->prob = -1.0;
        lane->sent = lane->sent - (long)i > 0 ? lane->sent - (long)i : 0;
        if (lane->extra) {
            long e = lane->extra - (long)i;
            long len = (long)PyList_GET_SIZE(ahead);
            if (len < e) e = len;
            lane->extra = e > 0 ? e : 0;
        }
        lane->streak = 0;
        set_low(c, lane);
        if (extend(c, lane) < 0) return -1;
    } else {
        long budget;
        int returning;
        if (reach(c, s, &budget, &returning) < 0) return -1;
        if (walk(c, lane, s, budget, returning) < 0) return -1;
    }
    if (PyList_GET_SIZE(lane->ahead) > lane->sent) return mark_dirty(c, lane);
    return 0;
}

/* The steps shared by _advance and _continue once the reader took ahead[0]: slide the window, top it up. */
static int advance(Core *c, Lane *lane, int *dirtied) {
    PyObject *ahead = lane->ahead, *probs = lane->probs;
    *dirtied = 0;
    if (PyList_SetSlice(ahead, 0, 1, NULL) < 0) return -1;
    if (PyList_GET_SIZE(probs) == 0) {
        PyErr_SetString(PyExc_IndexError, "pop from empty list");
        return -1;
    }
    double p0 = PyFloat_AsDouble(PyList_GET_ITEM(probs, 0));
    if (p0 == -1.0 && PyErr_Occurred()) return -1;
    if (PyList_SetSlice(probs, 0, 1, NULL) < 0) return -1;
    if (p0 != 1.0) lane->prob = -1.0;
    if (lane->sent) lane->sent -= 1;
    long n = (long)PyList_GET_SIZE(ahead);
    if (lane->extra) lane->extra = (lane->extra - 1) < n ? lane->extra - 1 : n;
    lane->streak += 1;
    if (lane->streak == c->trust_streak) set_low(c, lane);
    if (n <= lane->low && !lane->stuck) {
        if (extend(c, lane) < 0) return -1;
        if (PyList_GET_SIZE(lane->ahead) > lane->sent) {
            if (mark_dirty(c, lane) < 0) return -1;
            *dirtied = 1;
        }
    }
    return 0;
}

/* AccessProfiles.touch, inline: the shared first steps of _drain and _continue for slot s at access ``tick`` */
static inline void touch(Core *c, long s, long long tick, double horizon, double now) {
    long long at = c->tick_at[s];
    double h = (double)c->heat[s];
    if (at) {
        long long g = tick - at;
        if (h != 0.0) h *= pow(0.5, (double)g / horizon);
        double iv = (double)c->ival[s];
        c->ival[s] = iv == 0.0 ? (float)(double)g : (float)(iv + ((double)g - iv) * 0.25);
    }
    c->heat[s] = (float)(h + 1.0);
    c->tick_at[s] = tick;
    c->last[s] = now > 0.0 ? now : 1e-9;
    c->ref[s] = 1;
}

/* every 64 accesses: half-lives scale with the memory keys compete for */
static int rescale(Core *c, double *horizon) {
    Py_ssize_t n = PyObject_Size(c->resident);
    if (n < 0) return -1;
    if (n == 0) n = 4096;
    double half_life;
    if (get_d(c->profiles, s_half_life, &half_life) < 0) return -1;
    double h = half_life * (double)n;
    *horizon = h > 64.0 ? h : 64.0;
    return set_d(c->profiles, s_horizon, *horizon);
}

static int pop_due(Core *c, PyObject *key) {
    if (PyDict_GET_SIZE(c->due) == 0) return 0;
    if (PyDict_DelItem(c->due, key) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return -1;
        PyErr_Clear();
    }
    return 0;
}

static PyObject *family_of(Core *c, long s, PyObject *key) {
    PyObject *fam = PyList_GET_ITEM(c->family, s);
    if (fam != Py_None) return fam;
    const char *b = PyBytes_AS_STRING(key);
    Py_ssize_t len = PyBytes_GET_SIZE(key), i;
    for (i = len - 1; i >= 0; i--)
        if (b[i] == ':') break;
    PyObject *f = PyBytes_FromStringAndSize(b, i >= 0 ? i : 0);
    if (!f) return NULL;
    if (PyDict_GET_SIZE(c->families) >= FAMILIES_MAX) PyDict_Clear(c->families);
    PyObject *shared = PyDict_SetDefault(c->families, f, f);
    Py_DECREF(f);
    if (!shared) return NULL;
    Py_INCREF(shared);
    PyList_SET_ITEM(c->family, s, shared);
    Py_DECREF(fam);  /* the None it replaced */
    return shared;
}

/* PurePredictor._drain */
static int drain(Core *c) {
    if (PyList_GET_SIZE(c->log) == 0) return 0;
    PyObject *log = c->log;
    c->log = PyList_New(0);
    if (!c->log) {
        c->log = log;
        return -1;
    }
    int rc = -1;
    Stream *st = NULL;  /* owned: the stream of last_sid */
    long long tick;
    double horizon;
    if (get_ll(c->profiles, s_tick, &tick) < 0 || get_d(c->profiles, s_horizon, &horizon) < 0) goto done;
    double all_gap = c->gap;
    PyObject *last_sid = NULL;
    Py_ssize_t count = PyList_GET_SIZE(log);
    for (Py_ssize_t li = 0; li < count; li++) {
        PyObject *item = PyList_GET_ITEM(log, li);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 4) {
            PyErr_SetString(PyExc_TypeError, "a logged access is not a (key, sid, is_read, time) tuple");
            goto done;
        }
        PyObject *key = PyTuple_GET_ITEM(item, 0), *sid = PyTuple_GET_ITEM(item, 1);
        int is_read = PyTuple_GET_ITEM(item, 2) == Py_True;
        double now = PyFloat_AsDouble(PyTuple_GET_ITEM(item, 3));
        if (now == -1.0 && PyErr_Occurred()) goto done;
        if (!PyBytes_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "a predictor key must be bytes");
            goto done;
        }
        long s = slot_of(c, key);
        if (s < 0) goto done;
        tick += 1;
        touch(c, s, tick, horizon, now);
        if (!(tick & 63) && rescale(c, &horizon) < 0) goto done;
        int differs = 1;
        if (last_sid != NULL) {
            differs = PyObject_RichCompareBool(sid, last_sid, Py_NE);
            if (differs < 0) goto done;
        }
        if (differs) {
            PyObject *found = PyDict_GetItemWithError(c->streams, sid);
            if (found) {
                if (!Py_IS_TYPE(found, &StreamType)) {
                    PyErr_SetString(PyExc_TypeError, "a stream is not a kvstrata.native._predict.Stream");
                    goto done;
                }
                Py_INCREF(found);
                Py_XSETREF(st, (Stream *)found);
            } else {
                if (PyErr_Occurred()) goto done;
                c->gap = all_gap;
                Stream *made = get_stream(c, sid);
                if (!made) goto done;
                Py_INCREF(made);
                Py_XSETREF(st, made);
            }
            last_sid = sid;
        }
        double gap = st->gap;
        double limit = c->link_window * gap;
        if (limit < LINK_MIN) limit = LINK_MIN;
        long long g = st->tick;
        if (g) {
            g = tick - g;
            if ((double)g <= limit) {
                st->gap = gap + ((double)g - gap) * 0.125;
                all_gap += ((double)g - all_gap) * 0.01;
            }
        }
        st->tick = tick;
        PyObject *fam = family_of(c, s, key);
        Lane *lane = fam ? get_lane(c, st, fam) : NULL;
        if (!lane) goto done;
        Py_INCREF(lane);
        long prev = lane->prev;
        int same = 0;
        int err = 0;
        if (prev >= c->max_keys) {
            PyErr_SetString(PyExc_IndexError, "Lane.prev out of range");
            Py_DECREF(lane);
            goto done;
        }
        if (prev >= 0 && c->gen[prev] == lane->prev_gen && (double)(tick - lane->tick) <= limit) {
            if (prev == s) {
                lane->tick = tick;
                same = 1;
            } else if (lane->prev_read) {
                long succ = c->next[prev];
                if (succ >= 0 && c->gen[succ] == c->next_gen[prev]) {
                    long q;
                    if (is_read && succ == s) {
                        if (c->cont[prev] < COUNT_MAX) c->cont[prev] += 1;
                        uint8_t f = c->flags[prev];
                        if (!(f & BRANCH)) err = bump((f & BOUNDARY) ? c->boundary : c->interior, s_cont);
                    } else if (is_read && (q = c->pred[s]) >= 0 && c->gen[q] == c->pred_gen[s]) {
                        /* a chunk of another chain read in between: no evidence about prev */
                    } else {
                        err = outcome(c, prev, 0);
                        if (!err && !is_read) link_keys(c, prev, s);
                    }
                } else if (!is_read) {
                    if (link_keys(c, prev, s)) c->flags[prev] |= BOUNDARY;
                } else if (link_keys(c, prev, s)) {
                    err = outcome(c, prev, 1);
                }
            } else if (!is_read) {
                link_keys(c, prev, s);
            }
        }
        if (!err && !same) {
            if (is_read) {
                long q = c->pred[s];
                if (q >= 0 && q != prev && c->gen[q] == c->pred_gen[s] && (double)(tick - c->tick_at[q]) <= 4 * limit)
                    err = outcome(c, q, 1);
            }
            lane->prev = s;
            lane->prev_gen = c->gen[s];
            lane->prev_read = (char)is_read;
            lane->tick = tick;
        }
        if (!err) {
            Py_INCREF(lane);
            Py_XSETREF(st->hot, (PyObject *)lane);
        }
        if (err) {
            Py_DECREF(lane);
            goto done;
        }
        if (!is_read) {
            Py_DECREF(lane);
            continue;
        }
        if (pop_due(c, key) < 0 || !lane_lists_ok(lane)) {
            Py_DECREF(lane);
            goto done;
        }
        PyObject *ahead = lane->ahead;
        int next_is_key = 0;
        if (PyList_GET_SIZE(ahead)) {
            next_is_key = PyObject_RichCompareBool(PyList_GET_ITEM(ahead, 0), key, Py_EQ);
            if (next_is_key < 0) {
                Py_DECREF(lane);
                goto done;
            }
        }
        int r;
        if (next_is_key) {
            int dirtied;
            r = advance(c, lane, &dirtied);
        } else {
            c->gap = all_gap;
            r = slide(c, lane, key, s);
        }
        Py_DECREF(lane);
        if (r < 0) goto done;
    }
    rc = 0;
    c->gap = all_gap;
    if (set_ll(c->profiles, s_tick, tick) < 0) rc = -1;
done:
    Py_XDECREF(st);
    Py_DECREF(log);
    return rc;
}

/* PurePredictor._continue: read()'s short path; 1 when taken, 0 for anything else (nothing changed), -1 error */
static int cont_read(Core *c, Stream *st, Lane *lane, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(c->slots, key);
    if (!v) return PyErr_Occurred() ? -1 : 0;
    long s = PyLong_AsLong(v);
    if (s == -1 && PyErr_Occurred()) return -1;
    if (s < 0 || s >= c->max_keys) return 0;
    if (PyList_GET_ITEM(c->family, s) != lane->fam) return 0;
    long prev = lane->prev;
    if (prev < 0 || prev >= c->max_keys || prev == s || !lane->prev_read || c->next[prev] != s || c->gen[s] != c->next_gen[prev]
        || c->gen[prev] != lane->prev_gen)
        return 0;
    long long tick;
    if (get_ll(c->profiles, s_tick, &tick) < 0) return -1;
    tick += 1;
    double gap = st->gap;
    double limit = c->link_window * gap;
    if (limit < LINK_MIN) limit = LINK_MIN;
    if ((double)(tick - lane->tick) > limit) return 0;
    long q = c->pred[s];
    if (q >= 0 && q != prev && c->gen[q] == c->pred_gen[s] && (double)(tick - c->tick_at[q]) <= 4 * limit) return 0;
    double horizon;
    if (get_d(c->profiles, s_horizon, &horizon) < 0) return -1;
    if (set_ll(c->profiles, s_tick, tick) < 0) return -1;
    PyObject *nowo = PyObject_CallNoArgs(c->now);
    if (!nowo) return -1;
    double now = PyFloat_AsDouble(nowo);
    Py_DECREF(nowo);
    if (now == -1.0 && PyErr_Occurred()) return -1;
    touch(c, s, tick, horizon, now);
    if (!(tick & 63) && rescale(c, &horizon) < 0) return -1;
    long long g = st->tick;
    if (g) {
        g = tick - g;
        if ((double)g <= limit) {
            st->gap = gap + ((double)g - gap) * 0.125;
            c->gap += ((double)g - c->gap) * 0.01;
        }
    }
    st->tick = tick;
    if (c->cont[prev] < COUNT_MAX) c->cont[prev] += 1;
    uint8_t f = c->flags[prev];
    if (!(f & BRANCH) && bump((f & BOUNDARY) ? c->boundary : c->interior, s_cont) < 0) return -1;
    lane->prev = s;
    lane->prev_gen = c->gen[s];
    lane->tick = tick;
    if (pop_due(c, key) < 0) return -1;
    int dirtied;
    if (advance(c, lane, &dirtied) < 0) return -1;
    if (dirtied) c->pending = 1;
    return 1;
}

static int log_access(Core *c, PyObject *key, PyObject *sid, int is_read) {
    PyObject *nowo = PyObject_CallNoArgs(c->now);
    if (!nowo) return -1;
    PyObject *t = PyTuple_Pack(4, key, sid, is_read ? Py_True : Py_False, nowo);
    Py_DECREF(nowo);
    if (!t) return -1;
    int r = PyList_Append(c->log, t);
    Py_DECREF(t);
    if (r < 0) return -1;
    c->pending = 1;
    return 0;
}

static PyObject *Core_read(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "read(key, sid)");
        return NULL;
    }
    if (!core_ready(c)) return NULL;
    PyObject *key = args[0], *sid = args[1];
    if (c->short_path && PyList_GET_SIZE(c->log) == 0) {
        PyObject *sto = PyDict_GetItemWithError(c->streams, sid);
        if (!sto && PyErr_Occurred()) return NULL;
        if (sto && Py_IS_TYPE(sto, &StreamType)) {
            Stream *st = (Stream *)sto;
            PyObject *hot = st->hot;
            if (hot && Py_IS_TYPE(hot, &LaneType)) {
                Lane *lane = (Lane *)hot;
                if (!lane_lists_ok(lane)) return NULL;
                if (PyList_GET_SIZE(lane->ahead)) {
                    int eq = PyObject_RichCompareBool(PyList_GET_ITEM(lane->ahead, 0), key, Py_EQ);
                    if (eq < 0) return NULL;
                    if (eq) {
                        Py_INCREF(st);
                        Py_INCREF(lane);
                        int r = cont_read(c, st, lane, key);
                        Py_DECREF(lane);
                        Py_DECREF(st);
                        if (r < 0) return NULL;
                        if (r) Py_RETURN_NONE;
                    }
                }
            }
        }
    }
    if (log_access(c, key, sid, 1) < 0) return NULL;
    int in = PySequence_Contains(c->resident, key);
    if (in < 0) return NULL;
    if (!in || PyList_GET_SIZE(c->log) >= LOG_MAX) {
        if (drain(c) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Core_write(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write(key, sid)");
        return NULL;
    }
    if (!core_ready(c)) return NULL;
    if (log_access(c, args[0], args[1], 0) < 0) return NULL;
    if (PyList_GET_SIZE(c->log) >= LOG_MAX && drain(c) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_drain(Core *c, PyObject *unused) {
    if (!core_ready(c)) return NULL;
    if (drain(c) < 0) return NULL;
    Py_RETURN_NONE;
}

static int set_due(Core *c, PyObject *key, long long tick, double d) {
    PyObject *t = Py_BuildValue("(Ld)", tick + (long long)d, d);
    if (!t) return -1;
    int r = PyDict_SetItem(c->due, key, t);
    Py_DECREF(t);
    return r;
}

static PyObject *Core_take(Core *c, PyObject *unused) {
    if (!core_ready(c)) return NULL;
    if (!c->pending) return PyList_New(0);
    if (PyList_GET_SIZE(c->log) && drain(c) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    long long tick;
    if (get_ll(c->profiles, s_tick, &tick) < 0) goto fail;
    double gap = c->gap < 1.0 ? 1.0 : c->gap;
    Py_ssize_t na = PyList_GET_SIZE(c->announced);
    if (na) {
        for (Py_ssize_t i = 0; i < na; i++) {
            PyObject *key = PyList_GET_ITEM(c->announced, i);
            if (set_due(c, key, tick, (double)(i + 1) * gap) < 0) goto fail;
        }
        if (PyList_SetSlice(out, 0, 0, c->announced) < 0) goto fail;
        PyObject *fresh = PyList_New(0);
        if (!fresh) goto fail;
        Py_SETREF(c->announced, fresh);
    }
    if (PyDict_GET_SIZE(c->dirty)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(c->dirty, &pos, &k, &v)) {
            if (!Py_IS_TYPE(v, &LaneType)) {
                PyErr_SetString(PyExc_TypeError, "a lane is not a kvstrata.native._predict.Lane");
                goto fail;
            }
            Lane *lane = (Lane *)v;
            if (!lane_lists_ok(lane)) goto fail;
            Py_ssize_t n = PyList_GET_SIZE(lane->ahead);
            for (Py_ssize_t i = lane->sent; i < n; i++) {
                PyObject *key = PyList_GET_ITEM(lane->ahead, i);
                if (set_due(c, key, tick, (double)(i + 1) * gap) < 0) goto fail;
                if (PyList_Append(out, key) < 0) goto fail;
            }
            lane->sent = (long)n;
        }
        PyDict_Clear(c->dirty);
    }
    if (PyDict_GET_SIZE(c->due) > c->due_max) {
        /* the oldest quarter goes at once, into a new dict (see PurePredictor.take) */
        Py_ssize_t skip = PyDict_GET_SIZE(c->due) - py_floordiv(c->due_max * 3, 4), pos = 0, i = 0;
        PyObject *k, *v, *fresh = PyDict_New();
        if (!fresh) goto fail;
        while (PyDict_Next(c->due, &pos, &k, &v)) {
            if (i++ < skip) continue;
            if (PyDict_SetItem(fresh, k, v) < 0) {
                Py_DECREF(fresh);
                goto fail;
            }
        }
        Py_SETREF(c->due, fresh);
    }
    c->pending = 0;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *Core_grow(Core *c, PyObject *args) {
    PyObject *lane;
    long s;
    double prob;
    if (!PyArg_ParseTuple(args, "O!ld", &LaneType, &lane, &s, &prob)) return NULL;
    if (!core_ready(c)) return NULL;
    if (s < 0 || s >= c->max_keys) {
        PyErr_SetString(PyExc_IndexError, "profile slot out of range");
        return NULL;
    }
    if (grow(c, (Lane *)lane, s, prob) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Core_reach(Core *c, PyObject *arg) {
    long s = PyLong_AsLong(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    if (!core_ready(c)) return NULL;
    if (s < 0 || s >= c->max_keys) {
        PyErr_SetString(PyExc_IndexError, "profile slot out of range");
        return NULL;
    }
    long budget;
    int returning;
    if (reach(c, s, &budget, &returning) < 0) return NULL;
    return Py_BuildValue("(lO)", budget, returning ? Py_True : Py_False);
}

static PyObject *Core_get_profiles(Core *c, void *closure) {
    if (!c->profiles) {
        PyErr_SetString(PyExc_AttributeError, "_profiles");
        return NULL;
    }
    Py_INCREF(c->profiles);
    return c->profiles;
}

static int Core_set_profiles(Core *c, PyObject *value, void *closure) {
    if (value == NULL) {
        core_unbind(c);
        return 0;
    }
    return core_bind(c, value);
}

static PyGetSetDef Core_getset[] = {
    {"_profiles", (getter)Core_get_profiles, (setter)Core_set_profiles,
     "The AccessProfiles table; assigning it binds its arrays' memory.", NULL},
    {NULL}
};

static PyMemberDef Core_members[] = {
    {"_log", T_OBJECT_EX, offsetof(Core, log), 0, NULL},
    {"_streams", T_OBJECT_EX, offsetof(Core, streams), 0, NULL},
    {"_dirty", T_OBJECT_EX, offsetof(Core, dirty), 0, NULL},
    {"_due", T_OBJECT_EX, offsetof(Core, due), 0, NULL},
    {"_announced", T_OBJECT_EX, offsetof(Core, announced), 0, NULL},
    {"_families", T_OBJECT_EX, offsetof(Core, families), 0, NULL},
    {"resident", T_OBJECT_EX, offsetof(Core, resident), 0, NULL},
    {"_now", T_OBJECT_EX, offsetof(Core, now), 0, NULL},
    {"pending", T_BOOL, offsetof(Core, pending), 0, NULL},
    {"short_path", T_BOOL, offsetof(Core, short_path), 0, NULL},
    {"gap", T_DOUBLE, offsetof(Core, gap), 0, NULL},
    {"survival", T_DOUBLE, offsetof(Core, survival), 0, NULL},
    {"min_confidence", T_DOUBLE, offsetof(Core, min_confidence), 0, NULL},
    {"link_window", T_DOUBLE, offsetof(Core, link_window), 0, NULL},
    {"window", T_LONG, offsetof(Core, window), 0, NULL},
    {"session_max", T_LONG, offsetof(Core, session_max), 0, NULL},
    {"max_streams", T_LONG, offsetof(Core, max_streams), 0, NULL},
    {"trust_streak", T_LONG, offsetof(Core, trust_streak), 0, NULL},
    {"trust_ahead", T_LONG, offsetof(Core, trust_ahead), 0, NULL},
    {"refill", T_LONG, offsetof(Core, refill), 0, NULL},
    {"walks", T_LONG, offsetof(Core, walks), 0, NULL},
    {"session_walks", T_LONG, offsetof(Core, session_walks), 0, NULL},
    {"lookups", T_LONG, offsetof(Core, lookups), 0, NULL},
    {"expects", T_LONG, offsetof(Core, expects), 0, NULL},
    {"due_max", T_LONG, offsetof(Core, due_max), 0, NULL},
    {NULL}
};

static PyMethodDef Core_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Core_read, METH_FASTCALL, "Record a read of key by stream sid."},
    {"write", (PyCFunction)(void (*)(void))Core_write, METH_FASTCALL, "Record a write of key by stream sid."},
    {"take", (PyCFunction)Core_take, METH_NOARGS, "Predicted keys not handed out yet."},
    {"_drain", (PyCFunction)Core_drain, METH_NOARGS, "Process the logged accesses."},
    {"_grow", (PyCFunction)Core_grow, METH_VARARGS, "Extend a lane's walk from slot s."},
    {"_reach", (PyCFunction)Core_reach, METH_O, "(budget, returning) of a walk from slot s."},
    {NULL}
};

static int Core_traverse(Core *c, visitproc visit, void *arg) {
    Py_VISIT(c->profiles);
    Py_VISIT(c->slots);
    Py_VISIT(c->keys);
    Py_VISIT(c->family);
    Py_VISIT(c->interior);
    Py_VISIT(c->boundary);
    Py_VISIT(c->log);
    Py_VISIT(c->streams);
    Py_VISIT(c->dirty);
    Py_VISIT(c->due);
    Py_VISIT(c->announced);
    Py_VISIT(c->families);
    Py_VISIT(c->resident);
    Py_VISIT(c->now);
    return 0;
}

static int Core_clear(Core *c) {
    core_unbind(c);
    Py_CLEAR(c->log);
    Py_CLEAR(c->streams);
    Py_CLEAR(c->dirty);
    Py_CLEAR(c->due);
    Py_CLEAR(c->announced);
    Py_CLEAR(c->families);
    Py_CLEAR(c->resident);
    Py_CLEAR(c->now);
    return 0;
}

static void Core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    Core_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *Core_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Core *c = (Core *)type->tp_alloc(type, 0);
    if (!c) return NULL;
    c->log = PyList_New(0);
    c->streams = PyDict_New();
    c->dirty = PyDict_New();
    c->due = PyDict_New();
    c->announced = PyList_New(0);
    c->families = PyDict_New();
    c->resident = PyTuple_New(0);
    if (!c->log || !c->streams || !c->dirty || !c->due || !c->announced || !c->families || !c->resident) {
        Py_DECREF(c);
        return NULL;
    }
    c->gap = 1.0;
    c->survival = INFINITY;
    c->short_path = 1;
    c->due_max = 65536;
    return (PyObject *)c;
}

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvstrata.native._predict.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The predictor's state and hot path (kvstrata.engine.predict.Predictor's C base).",
    .tp_new = Core_tp_new,
    .tp_dealloc = (destructor)Core_dealloc,
    .tp_traverse = (traverseproc)Core_traverse,
    .tp_clear = (inquiry)Core_clear,
    .tp_methods = Core_methods,
    .tp_members = Core_members,
    .tp_getset = Core_getset,
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "kvstrata.native._predict",
    "The predictor's hot path in C (see kvstrata.engine.predict).", -1, NULL,
};

#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return NULL

PyMODINIT_FUNC PyInit__predict(void) {
    INTERN(s_tick, "tick");
    INTERN(s_horizon, "horizon");
    INTERN(s_half_life, "half_life");
    INTERN(s_cont, "cont");
    INTERN(s_stop, "stop");
    INTERN(s_prior_cont, "prior_cont");
    INTERN(s_prior_stop, "prior_stop");
    INTERN(s_slot, "slot");
    INTERN(s_forget, "_forget");
    INTERN(s_slots, "slots");
    INTERN(s_keys, "keys");
    INTERN(s_family, "family");
    INTERN(s_interior, "interior");
    INTERN(s_boundary, "boundary");
    if (PyType_Ready(&LaneType) < 0 || PyType_Ready(&StreamType) < 0 || PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Lane", (PyObject *)&LaneType) < 0
        || PyModule_AddObjectRef(m, "Stream", (PyObject *)&StreamType) < 0
        || PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0
        || PyModule_AddIntConstant(m, "LANES_PER_STREAM", LANES_PER_STREAM) < 0
        || PyModule_AddIntConstant(m, "LINK_MIN", LINK_MIN) < 0
        || PyModule_AddIntConstant(m, "FAMILIES_MAX", FAMILIES_MAX) < 0
        || PyModule_AddIntConstant(m, "LOG_MAX", LOG_MAX) < 0
        || PyModule_AddIntConstant(m, "COUNT_MAX", COUNT_MAX) < 0
        || PyModule_AddIntConstant(m, "BRANCH", BRANCH) < 0
        || PyModule_AddIntConstant(m, "BOUNDARY", BOUNDARY) < 0
        || PyModule_AddIntConstant(m, "HEAD", HEAD) < 0
        || PyModule_AddObject(m, "PRIOR_WEIGHT", PyFloat_FromDouble(PRIOR_WEIGHT)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
