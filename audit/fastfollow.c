/* The follow-up windows' common case in C: the record receiver of audit/followups.py
 * (Followups._fn's ``fn`` is the whole rule; this is the same rule, step for step).
 *
 * follower(owner, parts, ranks, part, settle, rank_cls, text_boot) -> fn
 *
 * ``fn(rec)`` reads one record for ``owner`` (a Followups): its (boot, rank)'s state from
 * ``ranks`` (made with ``rank_cls()`` the first time), a record before that state's seq marks the
 * owner disordered, else each of ``parts`` ((matches or None, role, index, key field, 1 << index),
 * in order) it plays: a window opened, followed or closed for a str key of a receipt (a closed
 * window that was followed counted here as ``settle`` counts it, one that was not handed to
 * ``settle(at, key, window, seq)``), and ``part(rec, state, seq, role, index, field)`` (the
 * general way) for a stop, a key that is not a str and a text line. An exception raised by a
 * call is raised from ``fn``, as the rule raises it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { WHEN, THEN, CLOSE, STOP };
/* the state a bound fn holds (a tuple) */
enum { S_OWNER, S_PARTS, S_RANKS, S_PART, S_SETTLE, S_RANK_CLS, S_TEXT_BOOT, S_AT, S_N };
/* S_AT, the last (boot, rank) read (a list): lines of one rank come in runs */
enum { AT_BOOT, AT_RANK, AT_STATE, AT_OPEN, AT_KEY, AT_TEXT, AT_N };

static PyObject *s_boot, *s_rank, *s_seq, *s_open, *s_disordered, *s_zero, *s_empty, *s_one;
static PyObject *s_windows, *s_by_then;

/* Refresh S_AT for (boot, rank) where it is another; 0, or -1 with an exception set */
static int moved_to(PyObject *state, PyObject *boot, PyObject *rank) {
    PyObject *at = PyTuple_GET_ITEM(state, S_AT);
    int ne = PyObject_RichCompareBool(rank, PyList_GET_ITEM(at, AT_RANK), Py_NE);
    if (ne == 0)
        ne = PyObject_RichCompareBool(boot, PyList_GET_ITEM(at, AT_BOOT), Py_NE);
    if (ne <= 0)
        return ne;
    PyObject *ranks = PyTuple_GET_ITEM(state, S_RANKS);
    PyObject *key = PyTuple_Pack(2, boot, rank);
    if (key == NULL)
        return -1;
    PyObject *st = PyDict_GetItemWithError(ranks, key);
    if (st != NULL) {
        Py_INCREF(st);
    } else if (PyErr_Occurred() ||
               (st = PyObject_CallNoArgs(PyTuple_GET_ITEM(state, S_RANK_CLS))) == NULL ||
               PyDict_SetItem(ranks, key, st) < 0) {
        Py_XDECREF(st);
        Py_DECREF(key);
        return -1;
    }
    PyObject *open = PyObject_GetAttr(st, s_open);
    int text = PyObject_RichCompareBool(boot, PyTuple_GET_ITEM(state, S_TEXT_BOOT), Py_EQ);
    if (open == NULL || text < 0) {
        Py_XDECREF(open);
        Py_DECREF(st);
        Py_DECREF(key);
        return -1;
    }
    PyObject *items[AT_N] = {boot, rank, st, open, key, text ? Py_True : Py_False};
    Py_INCREF(boot);
    Py_INCREF(rank);
    Py_INCREF(items[AT_TEXT]);
    for (int k = 0; k < AT_N; k++) /* the list takes each reference (and drops the old) */
        if (PyList_SetItem(at, k, items[k]) < 0)
            return -1;
    return 0;
}

/* counted[index] += 1 (an attribute's int, or an int in a list): 0, or -1 with an exception */
static int add_one(PyObject *owner, PyObject *name, Py_ssize_t index) {
    PyObject *held = PyObject_GetAttr(owner, name);
    if (held == NULL)
        return -1;
    PyObject *was = index < 0 ? held : PyList_Check(held) && index < PyList_GET_SIZE(held)
                                           ? PyList_GET_ITEM(held, index)
                                           : NULL;
    PyObject *now = was == NULL ? NULL : PyNumber_Add(was, s_one);
    int r = now == NULL ? -1 : index < 0 ? PyObject_SetAttr(owner, name, now)
                                         : PyList_SetItem(held, index, Py_NewRef(now));
    if (was == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_IndexError, "a follow-up's count is not in its list");
    Py_XDECREF(now);
    Py_DECREF(held);
    return r;
}

/* A closed window that was followed, counted as ``settle`` counts it (the windows, and under
 * the first `then` that followed it): 1; 0 where it is for ``settle`` (not followed, or its mask
 * past 64 bits); -1 with an exception set */
static int settled(PyObject *owner, PyObject *w) {
    PyObject *mask = PyList_GET_ITEM(w, 1);
    if (!PyLong_CheckExact(mask))
        return 0;
    int overflow = 0;
    long long m = PyLong_AsLongLongAndOverflow(mask, &overflow);
    if (m == -1 && PyErr_Occurred())
        return -1;
    if (overflow || m <= 0)
        return 0;
    if (add_one(owner, s_windows, -1) < 0 || add_one(owner, s_by_then, __builtin_ctzll(m)) < 0)
        return -1;
    return 1;
}

/* One part a receipt plays for a str key: 0, or -1 with an exception set */
static int play(PyObject *state, PyObject *open, long role, PyObject *bit, PyObject *k,
                PyObject *seq) {
    if (role == WHEN) {
        PyObject *w = PyList_New(3);
        if (w == NULL)
            return -1;
        Py_INCREF(seq);
        Py_INCREF(s_zero);
        Py_INCREF(s_empty);
        PyList_SET_ITEM(w, 0, seq);
        PyList_SET_ITEM(w, 1, s_zero);
        PyList_SET_ITEM(w, 2, s_empty);
        int r = PyDict_SetItem(open, k, w);
        Py_DECREF(w);
        return r;
    }
    PyObject *w = PyDict_GetItemWithError(open, k);
    if (w == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyList_CheckExact(w) || PyList_GET_SIZE(w) != 3) {
        PyErr_SetString(PyExc_TypeError, "a follow-up window is not a list of three");
        return -1;
    }
    Py_INCREF(w); /* held while it is settled, whatever that does */
    int later = PyObject_RichCompareBool(PyList_GET_ITEM(w, 0), seq, Py_LT);
    int r = later < 0 ? -1 : 0;
    if (later > 0 && role == THEN) {
        PyObject *mask = PyNumber_Or(PyList_GET_ITEM(w, 1), bit);
        r = mask == NULL ? -1 : PyList_SetItem(w, 1, mask);
    } else if (later > 0) { /* CLOSE: a `then` in this record has already followed it */
        PyObject *at = PyList_GET_ITEM(PyTuple_GET_ITEM(state, S_AT), AT_KEY);
        r = PyDict_DelItem(open, k);
        int done = r == 0 ? settled(PyTuple_GET_ITEM(state, S_OWNER), w) : 0;
        if (done < 0)
            r = -1;
        else if (r == 0 && !done) {
            PyObject *got = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(state, S_SETTLE), at,
                                                         k, w, seq, NULL);
            r = got == NULL ? -1 : 0;
            Py_XDECREF(got);
        }
    }
    Py_DECREF(w);
    return r;
}

/* Each part the record plays, in order: 0, or -1 with an exception set */
static int parts_of(PyObject *state, PyObject *rec, PyObject *st, PyObject *seq) {
    PyObject *parts = PyTuple_GET_ITEM(state, S_PARTS);
    PyObject *at = PyTuple_GET_ITEM(state, S_AT);
    for (Py_ssize_t n = 0; n < PyTuple_GET_SIZE(parts); n++) {
        PyObject *p = PyTuple_GET_ITEM(parts, n), *matches = PyTuple_GET_ITEM(p, 0);
        if (matches != Py_None) {
            PyObject *got = PyObject_CallOneArg(matches, rec);
            int yes = got == NULL ? -1 : PyObject_IsTrue(got);
            Py_XDECREF(got);
            if (yes < 0)
                return -1;
            if (!yes)
                continue;
        }
        PyObject *role_obj = PyTuple_GET_ITEM(p, 1), *field = PyTuple_GET_ITEM(p, 3);
        long role = PyLong_AsLong(role_obj);
        if (role == -1 && PyErr_Occurred())
            return -1;
        PyObject *k = PyDict_GetItemWithError(rec, field);
        if (k == NULL && PyErr_Occurred())
            return -1;
        int r;
        if (role == STOP || k == NULL || !PyUnicode_CheckExact(k) ||
            PyList_GET_ITEM(at, AT_TEXT) == Py_True) {
            PyObject *got = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(state, S_PART), rec, st,
                                                         seq, role_obj, PyTuple_GET_ITEM(p, 2),
                                                         field, NULL);
            r = got == NULL ? -1 : 0;
            Py_XDECREF(got);
        } else {
            Py_INCREF(k); /* the record's own, held while a call may change the record */
            PyObject *open = PyList_GET_ITEM(at, AT_OPEN);
            Py_INCREF(open);
            r = play(state, open, role, PyTuple_GET_ITEM(p, 4), k, seq);
            Py_DECREF(open);
            Py_DECREF(k);
        }
        if (r < 0)
            return -1;
    }
    return 0;
}

static PyObject *follow(PyObject *state, PyObject *rec) {
    if (!PyDict_Check(rec)) {
        PyErr_SetString(PyExc_TypeError, "a record is a dict");
        return NULL;
    }
    PyObject *boot = PyObject_GetItem(rec, s_boot);
    PyObject *rank = boot == NULL ? NULL : PyObject_GetItem(rec, s_rank);
    PyObject *seq = rank == NULL ? NULL : PyObject_GetItem(rec, s_seq);
    PyObject *st = NULL, *was = NULL, *result = NULL;
    if (seq == NULL || moved_to(state, boot, rank) < 0)
        goto done;
    st = PyList_GET_ITEM(PyTuple_GET_ITEM(state, S_AT), AT_STATE);
    Py_INCREF(st);
    if ((was = PyObject_GetAttr(st, s_seq)) == NULL)
        goto done;
    int before = PyObject_RichCompareBool(seq, was, Py_LT);
    if (before < 0)
        goto done;
    if (before) { /* before what was read: only the exact way can order it */
        if (PyObject_SetAttr(PyTuple_GET_ITEM(state, S_OWNER), s_disordered, Py_True) == 0)
            result = Py_NewRef(Py_None);
        goto done;
    }
    if (PyObject_SetAttr(st, s_seq, seq) == 0 && parts_of(state, rec, st, seq) == 0)
        result = Py_NewRef(Py_None);
done:
    Py_XDECREF(was);
    Py_XDECREF(st);
    Py_XDECREF(seq);
    Py_XDECREF(rank);
    Py_XDECREF(boot);
    return result;
}

static PyMethodDef follow_def = {"follow", (PyCFunction)follow, METH_O,
                                 "fn(rec): one record read for the windows (see follower)"};

PyObject *attest_follower(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != S_AT) {
        PyErr_SetString(PyExc_TypeError, "follower() takes 7 arguments");
        return NULL;
    }
    PyObject *parts = args[S_PARTS];
    if (!PyTuple_CheckExact(parts) || !PyDict_CheckExact(args[S_RANKS])) {
        PyErr_SetString(PyExc_TypeError, "follower() takes a tuple of parts and a dict");
        return NULL;
    }
    for (Py_ssize_t n = 0; n < PyTuple_GET_SIZE(parts); n++) {
        PyObject *p = PyTuple_GET_ITEM(parts, n);
        if (!PyTuple_CheckExact(p) || PyTuple_GET_SIZE(p) != 5) {
            PyErr_SetString(PyExc_TypeError, "a part is (matches, role, index, field, bit)");
            return NULL;
        }
    }
    PyObject *st = PyObject_CallNoArgs(args[S_RANK_CLS]); /* the state before any is read */
    PyObject *open = st == NULL ? NULL : PyObject_GetAttr(st, s_open);
    PyObject *at = open == NULL ? NULL : PyList_New(AT_N);
    if (at == NULL) {
        Py_XDECREF(open);
        Py_XDECREF(st);
        return NULL;
    }
    PyObject *items[AT_N] = {Py_None, Py_None, st, open, Py_None, Py_False};
    for (int k = 0; k < AT_N; k++) {
        if (k != AT_STATE && k != AT_OPEN)
            Py_INCREF(items[k]);
        PyList_SET_ITEM(at, k, items[k]);
    }
    PyObject *state = PyTuple_New(S_N);
    if (state == NULL) {
        Py_DECREF(at);
        return NULL;
    }
    for (int k = 0; k < S_AT; k++)
        PyTuple_SET_ITEM(state, k, Py_NewRef(args[k]));
    PyTuple_SET_ITEM(state, S_AT, at);
    PyObject *fn = PyCFunction_NewEx(&follow_def, state, NULL);
    Py_DECREF(state);
    return fn;
}

int attest_follow_init(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {{&s_boot, "boot"},   {&s_rank, "rank"},           {&s_seq, "seq"},
                 {&s_open, "open"},   {&s_disordered, "disordered"}, {&s_empty, ""},
                 {&s_windows, "windows"}, {&s_by_then, "by_then"}};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if ((*names[k].slot = PyUnicode_InternFromString(names[k].name)) == NULL)
            return -1;
    s_zero = PyLong_FromLong(0);
    s_one = PyLong_FromLong(1);
    return s_zero && s_one ? 0 : -1;
}
