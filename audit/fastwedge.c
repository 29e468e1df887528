/* The wedge detector's common steps in C (audit/wedge.py: WedgeDetector.feed is the whole rule).
 *
 * feeder(detector, stood, starts, waits, ends, iteration, feed) -> fn
 *
 * ``fn(rec)`` takes the steps of ``feed`` that most receipts take, on the rank ``detector`` read
 * last (its ``_last``): a receipt that cannot start a span where none is open, one without a
 * time, the scheduling rule's span opened, or measured within the threshold (and ended), a
 * receipt of a counted rank with no progress span open. Any other receipt (another rank's, a
 * stall's, an iteration's, a span past the threshold, anything of another type than the rule
 * reads) goes to ``feed`` whole, before this has changed anything, so both ways decide alike.
 * The detector's and each rank's state are read and written where their slots hold them (the
 * offsets of their member descriptors), as Python's own attribute access does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject *detector, *rank_type, *stood, *starts, *waits, *ends, *iteration, *feed;
    PyObject *threshold;
    double limit; /* the threshold as a double, where that is exact (else NaN: asked of Python) */
    Py_ssize_t last, r_waits, r_counted, r_since, r_base; /* slot offsets */
} Feeder;

static const char *CAPSULE = "attest.feeder";
static PyObject *w_rank, *w_boot, *w_event, *w_ts;

static PyObject *held(PyObject *obj, Py_ssize_t offset) { /* borrowed; NULL where unset */
    return *(PyObject **)((char *)obj + offset);
}

static void put(PyObject *obj, Py_ssize_t offset, PyObject *value) {
    PyObject **slot = (PyObject **)((char *)obj + offset), *old = *slot;
    *slot = Py_NewRef(value);
    Py_XDECREF(old);
}

/* 1 where a and b are equal ints or equal strs; 0 otherwise (then Python compares them) */
static int same(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b))
        return PyUnicode_Compare(a, b) == 0 && !PyErr_Occurred();
    if (PyLong_CheckExact(a) && PyLong_CheckExact(b))
        return PyObject_RichCompareBool(a, b, Py_EQ) == 1;
    return 0;
}

/* 1 where the set holds the str, 0 where not; -1 (error cleared) where asking failed */
static int in(PyObject *set, PyObject *s) {
    int r = PySet_Contains(set, s);
    if (r < 0)
        PyErr_Clear();
    return r;
}

/* ts - start <= threshold, as Python computes it: 1, 0, or -1 (error cleared) */
static int within(Feeder *f, PyObject *ts, PyObject *start) {
    if (PyFloat_CheckExact(ts) && PyFloat_CheckExact(start) && f->limit == f->limit)
        return PyFloat_AS_DOUBLE(ts) - PyFloat_AS_DOUBLE(start) <= f->limit;
    PyObject *took = PyNumber_Subtract(ts, start);
    int r = took == NULL ? -1 : PyObject_RichCompareBool(took, f->threshold, Py_LE);
    Py_XDECREF(took);
    if (r < 0)
        PyErr_Clear();
    return r;
}

/* The scheduling rule's inline steps: 1 taken, 0 feed's (nothing changed) */
static int scheduling(Feeder *f, PyObject *r, PyObject *rec, PyObject *event, PyObject *ts) {
    PyObject *since = held(r, f->r_since);
    if (since == Py_None) {
        if (in(f->waits, event) != 1)
            return 0;
        PyObject *span = PyTuple_Pack(2, ts, rec); /* requests held back: a span starts */
        if (span == NULL) {
            PyErr_Clear();
            return 0;
        }
        put(r, f->r_since, span);
        Py_DECREF(span);
        put(r, f->r_waits, Py_True);
        return 1;
    }
    if (since == NULL || !PyTuple_CheckExact(since) || PyTuple_GET_SIZE(since) != 2 ||
        within(f, ts, PyTuple_GET_ITEM(since, 0)) != 1)
        return 0;
    int ends = in(f->ends, event);
    if (ends < 0)
        return 0;
    if (ends) {
        put(r, f->r_since, Py_None);
        put(r, f->r_waits, Py_False);
    }
    return 1;
}

/* 1: the receipt is taken here; 0: it is feed's, and nothing was changed */
static int quick(Feeder *f, PyObject *rec) {
    PyObject *last = held(f->detector, f->last);
    if (!PyDict_CheckExact(rec) || last == NULL || !PyTuple_CheckExact(last) ||
        PyTuple_GET_SIZE(last) != 3)
        return 0;
    PyObject *r = PyTuple_GET_ITEM(last, 2);
    if (Py_TYPE(r) != (PyTypeObject *)f->rank_type)
        return 0;
    PyObject *rank = PyDict_GetItemWithError(rec, w_rank);
    PyObject *boot = rank == NULL ? NULL : PyDict_GetItemWithError(rec, w_boot);
    PyObject *event = boot == NULL ? NULL : PyDict_GetItemWithError(rec, w_event);
    if (event == NULL || !PyUnicode_CheckExact(event) ||
        !same(rank, PyTuple_GET_ITEM(last, 1)) || !same(boot, PyTuple_GET_ITEM(last, 0)) ||
        in(f->stood, event) != 0)
        return 0;
    PyObject *waits = held(r, f->r_waits), *counted = held(r, f->r_counted);
    if (waits == NULL || counted == NULL || !PyBool_Check(waits) || !PyBool_Check(counted))
        return 0;
    int starts = in(f->starts, event);
    if (starts < 0)
        return 0;
    if (waits == Py_False && !starts)
        return 1; /* nothing waits on this rank, and this receipt cannot start a wait */
    PyObject *ts = PyDict_GetItemWithError(rec, w_ts);
    if (ts == NULL || !(PyLong_Check(ts) || PyFloat_Check(ts)))
        return 1; /* no time: it measures nothing */
    int iteration = PyUnicode_Compare(event, f->iteration);
    if (iteration == 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (counted == Py_False)
        return scheduling(f, r, rec, event, ts);
    if (held(r, f->r_base) != Py_None)
        return 0;
    put(r, f->r_waits, Py_False); /* a counted rank: only counters open a span, none is open */
    return 1;
}

static PyObject *feed(PyObject *capsule, PyObject *rec) {
    Feeder *f = PyCapsule_GetPointer(capsule, CAPSULE);
    if (f == NULL)
        return NULL;
    if (quick(f, rec))
        Py_RETURN_NONE;
    PyErr_Clear(); /* a lookup that failed here: Python's own rule says what it is */
    return PyObject_CallOneArg(f->feed, rec);
}

static PyMethodDef feed_def = {"feed", (PyCFunction)feed, METH_O,
                               "fn(rec): one receipt read for the wedge detector (see feeder)"};

static void drop(Feeder *f) {
    PyObject *objs[] = {f->detector, f->rank_type, f->stood, f->starts,   f->waits,
                        f->ends,     f->iteration, f->feed,  f->threshold};
    for (size_t k = 0; k < sizeof objs / sizeof objs[0]; k++)
        Py_XDECREF(objs[k]);
    PyMem_Free(f);
}

static void release(PyObject *capsule) {
    Feeder *f = PyCapsule_GetPointer(capsule, CAPSULE);
    if (f != NULL)
        drop(f);
}

/* the threshold as a double where it compares with any double as Python compares it; NaN else */
static double exact(PyObject *threshold) {
    if (PyFloat_CheckExact(threshold))
        return PyFloat_AS_DOUBLE(threshold);
    if (PyLong_CheckExact(threshold)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(threshold, &overflow);
        if (!overflow && !PyErr_Occurred() && v > -(1LL << 53) && v < (1LL << 53))
            return (double)v;
        PyErr_Clear();
    }
    return Py_NAN;
}

/* The offset of a type's writable object slot ``name``; -1 with TypeError where it has none */
static Py_ssize_t slot_of(PyObject *type, const char *name) {
    PyObject *d = PyObject_GetAttrString(type, name);
    Py_ssize_t offset = -1;
    if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            offset = m->offset;
    }
    Py_XDECREF(d);
    if (offset < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "feeder(): %s is not an object slot", name);
    }
    return offset;
}

PyObject *attest_feeder(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "feeder() takes 8 arguments");
        return NULL;
    }
    for (int k = 2; k <= 5; k++)
        if (!PyFrozenSet_CheckExact(args[k])) {
            PyErr_SetString(PyExc_TypeError, "feeder() takes frozensets of kinds");
            return NULL;
        }
    if (!PyType_Check(args[1]) || !PyUnicode_CheckExact(args[6])) {
        PyErr_SetString(PyExc_TypeError, "feeder() takes the rank's type and a kind's name");
        return NULL;
    }
    Feeder *f = PyMem_Calloc(1, sizeof(Feeder));
    if (f == NULL)
        return PyErr_NoMemory();
    PyObject *type = (PyObject *)Py_TYPE(args[0]);
    f->last = slot_of(type, "_last");
    f->r_waits = f->last < 0 ? -1 : slot_of(args[1], "waits");
    f->r_counted = f->r_waits < 0 ? -1 : slot_of(args[1], "counted");
    f->r_since = f->r_counted < 0 ? -1 : slot_of(args[1], "since");
    f->r_base = f->r_since < 0 ? -1 : slot_of(args[1], "base");
    PyObject *threshold = f->r_base < 0 ? NULL : PyObject_GetAttrString(args[0], "threshold_s");
    if (threshold == NULL) {
        PyMem_Free(f);
        return NULL;
    }
    f->limit = exact(threshold);
    f->threshold = threshold;
    PyObject **objs[] = {&f->detector, &f->rank_type, &f->stood,     &f->starts,
                         &f->waits,    &f->ends,      &f->iteration, &f->feed};
    for (int k = 0; k < 8; k++)
        *objs[k] = Py_NewRef(args[k]);
    PyObject *capsule = PyCapsule_New(f, CAPSULE, release);
    if (capsule == NULL) {
        drop(f);
        return NULL;
    }
    PyObject *fn = PyCFunction_NewEx(&feed_def, capsule, NULL);
    Py_DECREF(capsule);
    return fn;
}

int attest_wedge_init(void) {
    w_rank = PyUnicode_InternFromString("rank");
    w_boot = PyUnicode_InternFromString("boot");
    w_event = PyUnicode_InternFromString("event");
    w_ts = PyUnicode_InternFromString("ts");
    return w_rank && w_boot && w_event && w_ts ? 0 : -1;
}
