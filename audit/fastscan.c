/* The reader's common case in C: a run of plain receipts of one (boot, rank) whose seqs follow
 * one another (audit/reader.py, _Pass.block, is the whole rule; this is its first branch).
 *
 * run(lines, i, routes, boot, rank, hi, top_iter, counts, loads, limit, deep_line, max_depth,
 *     skip, tracking) -> (j, hi, top_iter)
 *
 * From lines[i] on, each line that is a JSON object (parsed by ``loads``: orjson's, as the
 * reader's) with a known kind (``routes``: kind -> (required fields, receivers, index)), a str
 * boot equal to ``boot``, an int rank equal to ``rank``, a "v", an int seq equal to hi + 1 (hi
 * not 0, seq under ``limit``), every required field of its kind and no more than ``max_depth``
 * brackets where it is longer than ``deep_line``, is counted (counts[index] += 1), raises hi
 * and top_iter (an int "iter" above it), and goes to its kind's receivers in order. The first
 * line that is anything else stops the run before any of that is done for it: j is its index
 * (len(lines) when every line was taken), and the reader's own loop decides it. An exception
 * raised by a receiver is raised here, as the loop would raise it.
 *
 * Not ``tracking`` (a reading whose counts and seqs are not its own to keep: another process
 * keeps them), a line's boot, rank and seq need only be of their types, nothing is counted, and
 * a line that starts with "{" and ends with one of ``skip`` (',"event":"K"}' for a kind K no
 * receiver of this reading wants) is passed over unparsed: were it valid JSON, its last
 * top-level key would be "event" and K its kind, so no receiver could have wanted it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *k_event, *k_boot, *k_rank, *k_seq, *k_v, *k_iter, *one;

/* 1: this key of obj is there; 0: it is not (or looking failed: the error is cleared) */
static int has(PyObject *obj, PyObject *key) {
    int r = PyDict_Contains(obj, key);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return r;
}

/* obj[key] (borrowed), or NULL where it is missing or cannot be looked up (error cleared) */
static PyObject *get(PyObject *obj, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(obj, key);
    if (v == NULL)
        PyErr_Clear();
    return v;
}

static int same(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    int r = PyObject_RichCompareBool(a, b, Py_EQ);
    if (r < 0) {
        PyErr_Clear();
        return 0;
    }
    return r;
}

static int too_many_brackets(PyObject *line, Py_ssize_t deep_line, Py_ssize_t max_depth) {
    Py_ssize_t n = PyBytes_GET_SIZE(line);
    if (n <= deep_line)
        return 0;
    const char *p = PyBytes_AS_STRING(line);
    Py_ssize_t c = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        c += (p[k] == '[') | (p[k] == '{');
    return c > max_depth;
}

/* 1: the line is taken (*raise: its int iter, in *iter_out, is above top); 0: stop */
static int fits(PyObject *obj, PyObject *route, int tracking, PyObject *boot0, PyObject *rank0,
                long long hi, long long limit, long long top, int *raise, long long *iter_out) {
    PyObject *boot = get(obj, k_boot), *rank = get(obj, k_rank), *seq = get(obj, k_seq);
    if (boot == NULL || rank == NULL || seq == NULL || !PyUnicode_CheckExact(boot) ||
        !PyLong_CheckExact(rank) || !PyLong_CheckExact(seq) || !has(obj, k_v))
        return 0;
    PyObject *required = PyTuple_GET_ITEM(route, 0);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(required); k++)
        if (!has(obj, PyTuple_GET_ITEM(required, k)))
            return 0;
    *raise = 0;
    if (!tracking)
        return 1;
    if (!same(boot, boot0) || !same(rank, rank0))
        return 0;
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(seq, &overflow);
    if (overflow || (s == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (!(hi != 0 && s == hi + 1 && s < limit))
        return 0;
    PyObject *it = get(obj, k_iter);
    if (it != NULL && PyLong_CheckExact(it)) {
        long long v = PyLong_AsLongLongAndOverflow(it, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0; /* an iter past 64 bits: the loop compares it */
        }
        if (v > top) {
            *raise = 1;
            *iter_out = v;
        }
    }
    return 1;
}

/* counts[index] += 1; -1 with an exception set where that fails */
static int count(PyObject *counts, PyObject *index_obj) {
    Py_ssize_t index = PyLong_AsSsize_t(index_obj);
    if (index < 0 || index >= PyList_GET_SIZE(counts)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "a route's index is outside counts");
        return -1;
    }
    PyObject *was = PyList_GET_ITEM(counts, index);
    PyObject *now = PyNumber_Add(was, one);
    if (now == NULL)
        return -1;
    PyList_SET_ITEM(counts, index, now);
    Py_DECREF(was);
    return 0;
}

/* whether line ends with one of the suffixes in skip (a tuple of bytes) */
static int skipped(PyObject *line, PyObject *skip) {
    Py_ssize_t n = PyBytes_GET_SIZE(line);
    const char *p = PyBytes_AS_STRING(line);
    if (n < 2 || p[n - 1] != '}' || p[n - 2] != '"')
        return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(skip); k++) {
        PyObject *suffix = PyTuple_GET_ITEM(skip, k);
        Py_ssize_t m = PyBytes_GET_SIZE(suffix);
        if (m <= n && memcmp(p + n - m, PyBytes_AS_STRING(suffix), (size_t)m) == 0)
            return 1;
    }
    return 0;
}

static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "run() takes 14 arguments");
        return NULL;
    }
    PyObject *skip = args[12];
    int tracking = PyObject_IsTrue(args[13]);
    if (tracking < 0)
        return NULL;
    if (!PyTuple_CheckExact(skip)) {
        PyErr_SetString(PyExc_TypeError, "run() takes a tuple of suffixes to skip");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(skip); k++)
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(skip, k))) {
            PyErr_SetString(PyExc_TypeError, "a suffix to skip is not bytes");
            return NULL;
        }
    if (tracking && PyTuple_GET_SIZE(skip)) {
        PyErr_SetString(PyExc_ValueError, "a tracking reading skips nothing");
        return NULL;
    }
    PyObject *lines = args[0], *routes = args[2], *boot0 = args[3], *rank0 = args[4];
    PyObject *counts = args[7], *loads = args[8];
    if (!PyList_CheckExact(lines) || !PyDict_CheckExact(routes) || !PyList_CheckExact(counts)) {
        PyErr_SetString(PyExc_TypeError, "run() takes a list of lines, a dict and a list");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    long long limit = PyLong_AsLongLong(args[9]);
    Py_ssize_t deep_line = PyLong_AsSsize_t(args[10]), max_depth = PyLong_AsSsize_t(args[11]);
    if (PyErr_Occurred())
        return NULL;
    int overflow = 0, overflow2 = 0;
    long long hi = PyLong_AsLongLongAndOverflow(args[5], &overflow);
    long long top = PyLong_AsLongLongAndOverflow(args[6], &overflow2);
    if (PyErr_Occurred())
        return NULL;
    if (overflow || overflow2) /* numbers the loop keeps as Python ints: it goes on alone */
        return Py_BuildValue("(nOO)", i, args[5], args[6]);
    Py_ssize_t n = PyList_GET_SIZE(lines);
    for (; i < n; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyBytes_CheckExact(line) || PyBytes_GET_SIZE(line) == 0 ||
            PyBytes_AS_STRING(line)[0] != '{')
            break;
        if (PyTuple_GET_SIZE(skip) && skipped(line, skip))
            continue;
        PyObject *obj = PyObject_CallOneArg(loads, line);
        if (obj == NULL) {
            PyErr_Clear(); /* the loop parses it again and says what it is */
            break;
        }
        PyObject *route = NULL, *ev;
        long long it = 0;
        int raise = 0;
        if (PyDict_CheckExact(obj) && (ev = get(obj, k_event)) != NULL &&
            (route = get(routes, ev)) != NULL && PyTuple_CheckExact(route) &&
            PyTuple_GET_SIZE(route) == 3 &&
            fits(obj, route, tracking, boot0, rank0, hi, limit, top, &raise, &it) &&
            !too_many_brackets(line, deep_line, max_depth)) {
            if (tracking && count(counts, PyTuple_GET_ITEM(route, 2)) < 0) {
                Py_DECREF(obj);
                return NULL;
            }
            if (tracking)
                hi += 1;
            if (raise)
                top = it;
            Py_INCREF(route); /* held while its receivers run, whatever they do */
            PyObject *fns = PyTuple_GET_ITEM(route, 1);
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(fns); k++) {
                PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(fns, k), obj);
                if (r == NULL) {
                    Py_DECREF(route);
                    Py_DECREF(obj);
                    return NULL;
                }
                Py_DECREF(r);
            }
            Py_DECREF(route);
            Py_DECREF(obj);
            continue;
        }
        Py_DECREF(obj);
        break;
    }
    return Py_BuildValue("(nLL)", i, hi, top);
}

PyObject *attest_follower(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
int attest_follow_init(void); /* both in fastfollow.c, built into this module */
PyObject *attest_feeder(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
int attest_wedge_init(void); /* both in fastwedge.c, built into this module */

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL,
     "run(lines, i, routes, boot, rank, hi, top_iter, counts, loads, limit, deep_line, "
     "max_depth, skip, tracking) -> (j, hi, top_iter)"},
    {"follower", (PyCFunction)(void (*)(void))attest_follower, METH_FASTCALL,
     "follower(owner, parts, ranks, part, settle, rank_cls, text_boot) -> fn (fastfollow.c)"},
    {"feeder", (PyCFunction)(void (*)(void))attest_feeder, METH_FASTCALL,
     "feeder(detector, rank_type, stood, starts, waits, ends, iteration, feed) -> fn "
     "(fastwedge.c)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "attest_fastscan", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_attest_fastscan(void) {
    k_event = PyUnicode_InternFromString("event");
    k_boot = PyUnicode_InternFromString("boot");
    k_rank = PyUnicode_InternFromString("rank");
    k_seq = PyUnicode_InternFromString("seq");
    k_v = PyUnicode_InternFromString("v");
    k_iter = PyUnicode_InternFromString("iter");
    one = PyLong_FromLong(1);
    if (!k_event || !k_boot || !k_rank || !k_seq || !k_v || !k_iter || !one ||
        attest_follow_init() < 0 || attest_wedge_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
