/* Input records consumed in C (see stream/kafka/native.py for why and how it is used).
 *
 * Queue(consumer, topic): input records of a confluent_kafka.Consumer taken in C. The fetch queue of each input
 * partition is forwarded ("routed", before the partition is assigned) to a queue of our own; consume() takes up
 * to n records from it with one rd_kafka_consume_batch_queue() call (GIL released) and copies them into one
 * buffer: no Python object per record but its key. librdkafka's own serving of that call keeps what
 * confluent-kafka's consume() does for fetched records (outdated ones after a seek or a revoke are dropped, the
 * consumed position advances, the poll interval is reset). Rebalances, commit results and client errors stay on
 * the consumer's queue, which confluent-kafka's consume() serves (its callbacks need its own call state); when
 * something arrives there, a consume() blocked here returns early and says so ("pending"). */
#include "_rdkafka.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REPLY_HEADERS 16
#define COPY_WITH_GIL (64 * 1024) /* bytes: a take smaller than this copies with the GIL held */

typedef struct {
    PyObject_HEAD
    PyObject *consumer; /* kept alive while the queue is open */
    rd_kafka_t *rk;
    rd_kafka_queue_t *q;  /* ours: the routed partitions' records */
    rd_kafka_queue_t *cq; /* the consumer's queue (a reference to it) */
    char *topic;
    char **reply_headers; /* the headers whose values consume() returns per record; NULL: none */
    Py_ssize_t n_reply_headers;
    rd_kafka_message_t **msgs;
    Py_ssize_t cap;
} Queue;

/* From a librdkafka thread, on every op put on the consumer's queue: wake a consume() blocked on ours. */
static void on_consumer_queue(rd_kafka_t *rk, void *opaque) {
    (void)rk;
    rdk.queue_yield((rd_kafka_queue_t *)opaque);
}

static void free_names(char **names, Py_ssize_t n) {
    if (!names)
        return;
    for (Py_ssize_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int Queue_init(Queue *self, PyObject *args, PyObject *kwargs) {
    static char *kws[] = {"consumer", "topic", "reply_headers", NULL};
    PyObject *consumer, *names = NULL;
    const char *topic;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Os|O", kws, &consumer, &topic, &names))
        return -1;
    if (self->q || self->consumer) {
        PyErr_SetString(PyExc_RuntimeError, "already initialised");
        return -1;
    }
    Py_ssize_t n_names = 0;
    if (names && names != Py_None) {
        if (!PyTuple_Check(names) || PyTuple_GET_SIZE(names) < 1 || PyTuple_GET_SIZE(names) > MAX_REPLY_HEADERS) {
            PyErr_Format(PyExc_TypeError, "reply_headers must be a tuple of 1 to %d header names",
                         MAX_REPLY_HEADERS);
            return -1;
        }
        n_names = PyTuple_GET_SIZE(names);
        for (Py_ssize_t i = 0; i < n_names; i++)
            if (!PyUnicode_Check(PyTuple_GET_ITEM(names, i))) {
                PyErr_SetString(PyExc_TypeError, "reply_headers must be a tuple of str");
                return -1;
            }
    }
    rd_kafka_t *rk = client_handle(consumer, "Consumer", RD_KAFKA_CONSUMER);
    if (!rk)
        return -1;
    rd_kafka_queue_t *cq = rdk.queue_get_consumer(rk);
    if (!cq) {
        PyErr_SetString(PyExc_ValueError, "the consumer has no group (group.id)");
        return -1;
    }
    int failed = 0;
    char **copies = n_names ? calloc((size_t)n_names, sizeof *copies) : NULL;
    if (n_names && !copies)
        failed = 1;
    for (Py_ssize_t i = 0; i < n_names && !failed; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        if (!name || !(copies[i] = strdup(name)))
            failed = 1;
    }
    self->topic = failed ? NULL : strdup(topic);
    self->q = self->topic ? rdk.queue_new(rk) : NULL;
    if (!self->q) {
        rdk.queue_destroy(cq);
        free(self->topic);
        self->topic = NULL;
        free_names(copies, n_names);
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        return -1;
    }
    self->reply_headers = copies;
    self->n_reply_headers = n_names;
    self->cq = cq;
    self->rk = rk;
    Py_INCREF(consumer);
    self->consumer = consumer;
    rdk.queue_cb_event_enable(cq, on_consumer_queue, self->q);
    return 0;
}

/* Whether the consumer this queue was made on is still open: its close() destroys the client (and the queues
 * with it), so a queue outliving it must not touch them. */
static int consumer_open(Queue *self) {
    return self->consumer && ((HandleHead *)self->consumer)->rk == self->rk;
}

static int open_or_raise(Queue *self) {
    if (self->q && consumer_open(self))
        return 0;
    PyErr_SetString(PyExc_RuntimeError, self->q ? "the consumer was closed before its native queue"
                                                : "the native queue is closed");
    return -1;
}

/* route(partitions): forward these input partitions' fetch queues to ours. Call it before they are assigned
 * (in on_assign), so no record of theirs reaches the consumer's queue first. */
static PyObject *Queue_route(Queue *self, PyObject *args) {
    PyObject *partitions;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &partitions) || open_or_raise(self) < 0)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(partitions); i++) {
        long p = PyLong_AsLong(PyList_GET_ITEM(partitions, i));
        if (p == -1 && PyErr_Occurred())
            return NULL;
        if (p < 0 || p > INT32_MAX)
            return PyErr_Format(PyExc_ValueError, "partition %ld out of range", p);
        rd_kafka_queue_t *pq = rdk.queue_get_partition(self->rk, self->topic, (int32_t)p);
        if (!pq)
            return PyErr_Format(PyExc_ValueError, "no partition %s [%ld]", self->topic, p);
        rdk.queue_forward(pq, self->q);
        rdk.queue_destroy(pq);
    }
    Py_RETURN_NONE;
}

/* A take's watched header values (the reply headers' names), copied out of each record's headers as it is taken:
 * librdkafka parses a record's headers whole (up to 100,000 of them, each a separate allocation of some 64 bytes
 * beside its name and value) and keeps them until the record is released, so a take of records carrying many
 * headers held every one of them at once. Each record's are freed as soon as its watched values are copied. */
typedef struct {
    char *bytes;  /* the values, back to back */
    size_t used, cap;
    int64_t *at;   /* [row * names + name]: (start in bytes, length; -1: absent) pairs; NULL until a row has one */
    int64_t *side; /* [row]: its key's and watched values' bytes (`Records.side_bytes`); NULL until one has any */
} Watched;

static void watched_free(Watched *w) {
    free(w->bytes);
    free(w->at);
    free(w->side);
}

/* Record m's watched values into w (row `row` of `rows`): of each name, the last header's, absent when its value
 * is null (as rd_kafka_header_get_last finds it), in one pass over the headers; then its parsed headers are
 * freed. A record whose headers librdkafka cannot parse (more than 100,000, or malformed) has none, as before.
 * *held: the values' bytes. 1: it has one; 0: none; -1: out of memory. Needs no GIL. */
static int take_watched(const Queue *self, rd_kafka_message_t *m, Py_ssize_t row, Py_ssize_t rows, Watched *w,
                        size_t *held) {
    rd_kafka_headers_t *hdrs;
    if (rdk.message_detach_headers(m, &hdrs) != 0)
        return 0;
    const Py_ssize_t k = self->n_reply_headers;
    const void *values[MAX_REPLY_HEADERS];
    size_t sizes[MAX_REPLY_HEADERS];
    for (Py_ssize_t h = 0; h < k; h++)
        values[h] = NULL;
    const size_t count = rdk.header_cnt(hdrs);
    for (size_t i = 0; i < count; i++) {
        const char *name;
        const void *value;
        size_t size;
        if (rdk.header_get_all(hdrs, i, &name, &value, &size) != 0)
            break;
        for (Py_ssize_t h = 0; h < k; h++)
            if (name[0] == self->reply_headers[h][0] && strcmp(name, self->reply_headers[h]) == 0) {
                values[h] = value;
                sizes[h] = size;
                break;
            }
    }
    int found = 0, rc = 0;
    size_t need = 0;
    for (Py_ssize_t h = 0; h < k; h++)
        if (values[h]) {
            found = 1;
            need += sizes[h];
        }
    if (found && !w->at) { /* the first row with one: the table, every row absent */
        w->at = malloc((size_t)rows * (size_t)k * 2 * sizeof *w->at);
        if (!w->at)
            rc = -1;
        else
            for (Py_ssize_t i = 0; i < rows * k; i++)
                w->at[2 * i + 1] = -1;
    }
    if (found && rc == 0 && w->used + need > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->used + need)
            cap *= 2;
        char *grown = realloc(w->bytes, cap);
        if (!grown)
            rc = -1;
        else {
            w->bytes = grown;
            w->cap = cap;
        }
    }
    if (found && rc == 0) {
        for (Py_ssize_t h = 0; h < k; h++)
            if (values[h]) {
                if (sizes[h]) /* an empty one: no buffer yet, maybe */
                    memcpy(w->bytes + w->used, values[h], sizes[h]);
                w->at[2 * (row * k + h)] = (int64_t)w->used;
                w->at[2 * (row * k + h) + 1] = (int64_t)sizes[h];
                w->used += sizes[h];
            }
        *held = need;
        rc = 1;
    }
    rdk.headers_destroy(hdrs);
    return rc;
}

/* Whether row `row` has a watched value (of `names` names) in w. */
static int row_watched(const Watched *w, Py_ssize_t row, Py_ssize_t names) {
    for (Py_ssize_t h = 0; h < names; h++)
        if (w->at[2 * (row * names + h) + 1] >= 0)
            return 1;
    return 0;
}

/* Row `row`'s watched values into (*replies)[row]: a tuple of each name's value (or None), then the record's
 * Kafka timestamp in ms (None: it has none) and when it was taken (``taken_ns``, the wall clock's ns: the tracing
 * spans of `stream.ops.tracing` start from them); *replies is made at the first. 0, or -1 with an exception set. */
static int add_reply(const Queue *self, const rd_kafka_message_t *m, const Watched *w, Py_ssize_t row,
                     PyObject *taken_ns, PyObject **replies) {
    const Py_ssize_t n = self->n_reply_headers;
    const int64_t *at = w->at + 2 * row * n;
    PyObject *item = PyTuple_New(n + 2);
    if (!item)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = at[2 * i + 1] >= 0 ? PyBytes_FromStringAndSize(w->bytes + at[2 * i], (Py_ssize_t)at[2 * i + 1])
                                         : Py_NewRef(Py_None);
        if (!v) {
            Py_DECREF(item);
            return -1;
        }
        PyTuple_SET_ITEM(item, i, v);
    }
    int ts_type;
    const int64_t ts = rdk.message_timestamp(m, &ts_type);
    PyObject *when = ts >= 0 ? PyLong_FromLongLong((long long)ts) : Py_NewRef(Py_None);
    if (!when) {
        Py_DECREF(item);
        return -1;
    }
    PyTuple_SET_ITEM(item, n, when);
    PyTuple_SET_ITEM(item, n + 1, Py_NewRef(taken_ns));
    PyObject *key = PyLong_FromSsize_t(row);
    if (key && !*replies)
        *replies = PyDict_New();
    int rc = key && *replies ? PyDict_SetItem(*replies, key, item) : -1;
    Py_XDECREF(key);
    Py_DECREF(item);
    return rc;
}

/* The wall clock in ns, as time.time_ns() (a new reference). */
static PyObject *wall_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
}

/* consume(n, timeout_s, first=False)
 *   -> (values, starts, lengths, keys, partitions, offsets, errors, pending, replies, side_bytes)
 * Up to n records (waiting up to timeout_s for n, returning early when the consumer's queue gets something; with
 * first, waiting up to timeout_s for one, then taking up to n - 1 more of those already fetched without waiting):
 * values back to back in one bytes; starts and lengths int64 bytes (length -1: a null value); keys a list of
 * bytes or None; partitions int32 bytes; offsets int64 bytes; errors [(partition, offset, code, text)] for error
 * events among them (end of partition included); pending: the consumer's queue holds something to serve;
 * replies: {row: (each reply_headers name's last value, or None; then its timestamp in ms and when it was taken in
 * ns, `add_reply`)} of the records carrying at least one of those headers, None when none does; side_bytes: int64
 * bytes, each record's key's and watched values' bytes, None when none has any. */
static PyObject *Queue_consume(Queue *self, PyObject *args) {
    Py_ssize_t max;
    double timeout_s;
    int first = 0;
    if (!PyArg_ParseTuple(args, "nd|p", &max, &timeout_s, &first) || open_or_raise(self) < 0)
        return NULL;
    if (max < 1 || max > (1 << 24))
        return PyErr_Format(PyExc_ValueError, "n must be in 1..2**24, got %zd", max);
    if (self->cap < max) {
        rd_kafka_message_t **grown = realloc(self->msgs, (size_t)max * sizeof *grown);
        if (!grown)
            return PyErr_NoMemory();
        self->msgs = grown;
        self->cap = max;
    }
    rd_kafka_message_t **msgs = self->msgs;
    const int wait_ms = timeout_ms(timeout_s, 0);
    if (PyErr_Occurred())
        return NULL;
    /* Only what makes Python objects holds the GIL. Without it: the wait, the count and the copies of the reply
     * headers' values (one pass, `take_watched`), then, once the result's buffers exist, the copies into them and
     * the records' release (a second). Each release is a chance for another thread to take the GIL, which this
     * one may then wait for: a take of less than COPY_WITH_GIL bytes does its copies with the GIL held. The
     * buffers are this call's alone until it returns; consume() and close() are called from one thread (the poll
     * loop), as before. */
    ssize_t n;
    Py_ssize_t good = 0, nerr = 0;
    size_t total = 0;
    Watched watched = {0};
    int no_memory = 0;
    Py_BEGIN_ALLOW_THREADS
    if (first) { /* the wait is for the first record; then what is already fetched, without waiting */
        n = rdk.consume_batch_queue(self->q, wait_ms, msgs, 1);
        if (n == 1 && max > 1) {
            const ssize_t more = rdk.consume_batch_queue(self->q, 0, msgs + 1, (size_t)max - 1);
            n += more > 0 ? more : 0;
        }
    } else
        n = rdk.consume_batch_queue(self->q, wait_ms, msgs, (size_t)max);
    for (ssize_t i = 0; i < n; i++) {
        rd_kafka_message_t *m = msgs[i];
        if (m->err) {
            nerr++;
            continue;
        }
        size_t held = 0; /* its key's and watched values' bytes */
        if (self->n_reply_headers && !no_memory && take_watched(self, m, good, (Py_ssize_t)n, &watched, &held) < 0)
            no_memory = 1;
        held += m->key ? m->key_len : 0;
        if (held && !no_memory && !watched.side && !(watched.side = calloc((size_t)n, sizeof *watched.side)))
            no_memory = 1;
        if (held && watched.side)
            watched.side[good] = (int64_t)held;
        good++;
        total += m->payload ? m->len : 0;
    }
    Py_END_ALLOW_THREADS
    if (n < 0)
        return PyErr_Format(PyExc_RuntimeError, "consume: %s", rdk.err2str(rdk.last_error()));
    PyObject *result = NULL;
    PyObject *values = NULL, *starts = NULL, *lens = NULL, *parts = NULL, *offs = NULL, *keys = NULL, *errors = NULL;
    PyObject *replies = NULL; /* {row: the reply headers' values}, made at the first record with one */
    PyObject *taken_ns = NULL; /* the wall clock, read at the first record with headers */
    PyObject *side_bytes = NULL; /* watched.side as int64 bytes, or None */
    Py_ssize_t failed = no_memory;
    if (no_memory)
        PyErr_NoMemory();
    else {
        values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        starts = PyBytes_FromStringAndSize(NULL, good * 8);
        lens = PyBytes_FromStringAndSize(NULL, good * 8);
        parts = PyBytes_FromStringAndSize(NULL, good * 4);
        offs = PyBytes_FromStringAndSize(NULL, good * 8);
        keys = PyList_New(good);
        errors = PyList_New(nerr);
        side_bytes = watched.side ? PyBytes_FromStringAndSize((const char *)watched.side, good * 8)
                                  : Py_NewRef(Py_None);
        failed = !(values && starts && lens && parts && offs && keys && errors && side_bytes);
    }
    for (ssize_t i = 0, g = 0, e = 0; i < n && !failed; i++) { /* the objects: keys, errors, replies */
        const rd_kafka_message_t *m = msgs[i];
        PyObject *item;
        if (m->err) {
            item = m->payload && m->len
                       ? Py_BuildValue("(iLiN)", m->partition, (long long)m->offset, m->err,
                                       PyUnicode_DecodeUTF8(m->payload, (Py_ssize_t)m->len, "replace"))
                       : Py_BuildValue("(iLis)", m->partition, (long long)m->offset, m->err, rdk.err2str(m->err));
            if (!item)
                failed = 1;
            else
                PyList_SET_ITEM(errors, e++, item);
            continue;
        }
        item = m->key ? PyBytes_FromStringAndSize(m->key, (Py_ssize_t)m->key_len) : Py_NewRef(Py_None);
        if (!item) {
            failed = 1;
            break;
        }
        PyList_SET_ITEM(keys, g, item);
        if (watched.at && row_watched(&watched, g, self->n_reply_headers)) {
            if (!taken_ns && !(taken_ns = wall_ns()))
                failed = 1;
            else if (add_reply(self, m, &watched, g, taken_ns, &replies) < 0)
                failed = 1;
        }
        g++;
    }
    watched_free(&watched);
    /* The copies (if the buffers were made), then the records' release, whatever happened: a failure here fails
     * the caller, whose offsets then stay where their acknowledged predictions put them. */
    char *vb = values ? PyBytes_AS_STRING(values) : NULL;
    int64_t *st = starts ? (int64_t *)PyBytes_AS_STRING(starts) : NULL;
    int64_t *ln = lens ? (int64_t *)PyBytes_AS_STRING(lens) : NULL;
    int32_t *pt = parts ? (int32_t *)PyBytes_AS_STRING(parts) : NULL;
    int64_t *of = offs ? (int64_t *)PyBytes_AS_STRING(offs) : NULL;
    const int copy = !failed;
    const int release_gil = total >= COPY_WITH_GIL;
    PyThreadState *saved = release_gil ? PyEval_SaveThread() : NULL;
    for (ssize_t i = 0, g = 0, at = 0; i < n; i++) {
        const rd_kafka_message_t *m = msgs[i];
        if (copy && !m->err) {
            st[g] = at;
            if (m->payload) {
                memcpy(vb + at, m->payload, m->len);
                ln[g] = (int64_t)m->len;
                at += (ssize_t)m->len;
            } else
                ln[g] = -1;
            pt[g] = m->partition;
            of[g] = m->offset;
            g++;
        }
        rdk.message_destroy(msgs[i]);
    }
    if (saved)
        PyEval_RestoreThread(saved);
    if (!failed)
        result = Py_BuildValue("(OOOOOOOOOO)", values, starts, lens, keys, parts, offs, errors,
                               rdk.queue_length(self->cq) > 0 ? Py_True : Py_False, replies ? replies : Py_None,
                               side_bytes);
    Py_XDECREF(values);
    Py_XDECREF(starts);
    Py_XDECREF(lens);
    Py_XDECREF(parts);
    Py_XDECREF(offs);
    Py_XDECREF(keys);
    Py_XDECREF(errors);
    Py_XDECREF(replies);
    Py_XDECREF(taken_ns);
    Py_XDECREF(side_bytes);
    return result;
}

/* pending() -> the consumer's queue holds something (a rebalance, a commit result, an error) to serve. */
static PyObject *Queue_pending(Queue *self, PyObject *noargs) {
    (void)noargs;
    if (open_or_raise(self) < 0)
        return NULL;
    return PyBool_FromLong(rdk.queue_length(self->cq) > 0);
}

/* wake(): a consume() blocked on the queue returns now (from any thread). */
static PyObject *Queue_wake(Queue *self, PyObject *noargs) {
    (void)noargs;
    if (self->q && consumer_open(self))
        rdk.queue_yield(self->q);
    Py_RETURN_NONE;
}

static void queue_close(Queue *self) {
    if (self->q && consumer_open(self)) {
        rdk.queue_cb_event_enable(self->cq, NULL, NULL);
        rdk.queue_destroy(self->cq);
        rdk.queue_destroy(self->q); /* what is still in it is dropped; the routed partitions' records after it too */
    }
    /* A consumer closed first took its queues with it: nothing is left to release here. */
    self->q = NULL;
    self->cq = NULL;
    self->rk = NULL;
    Py_CLEAR(self->consumer);
}

/* close(): release the queue. Must come before the consumer's close(), which destroys the client. */
static PyObject *Queue_close(Queue *self, PyObject *noargs) {
    (void)noargs;
    queue_close(self);
    Py_RETURN_NONE;
}

/* The consumer is the one Python object a queue holds: a cycle through it (an on_assign callback that keeps the
 * queue) is collected. */
static int Queue_traverse(Queue *self, visitproc visit, void *arg) {
    Py_VISIT(self->consumer);
    return 0;
}

static int Queue_clear(Queue *self) {
    queue_close(self);
    return 0;
}

static void Queue_dealloc(Queue *self) {
    PyObject_GC_UnTrack(self);
    queue_close(self);
    free(self->msgs);
    free(self->topic);
    free_names(self->reply_headers, self->n_reply_headers);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Queue_methods[] = {
    {"route", (PyCFunction)Queue_route, METH_VARARGS, "Forward these partitions' records to this queue."},
    {"consume", (PyCFunction)Queue_consume, METH_VARARGS, "Take up to n records as one batch."},
    {"pending", (PyCFunction)Queue_pending, METH_NOARGS, "Whether the consumer's own queue has ops to serve."},
    {"wake", (PyCFunction)Queue_wake, METH_NOARGS, "Make a blocked consume() return."},
    {"close", (PyCFunction)Queue_close, METH_NOARGS, "Release the queue (before closing the consumer)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject QueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stream.kafka._nativeconsume.Queue",
    .tp_basicsize = sizeof(Queue),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Queue(consumer: confluent_kafka.Consumer, topic: str)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Queue_init,
    .tp_dealloc = (destructor)Queue_dealloc,
    .tp_traverse = (traverseproc)Queue_traverse,
    .tp_clear = (inquiry)Queue_clear,
    .tp_methods = Queue_methods,
};

static PyMethodDef module_methods[] = {
    {"load", rdk_load, METH_VARARGS, "load(path): bind to the librdkafka shared library at path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "stream.kafka._nativeconsume", NULL, -1, module_methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nativeconsume(void) {
    if (PyType_Ready(&QueueType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&QueueType);
    if (PyModule_AddObject(m, "Queue", (PyObject *)&QueueType) < 0) {
        Py_DECREF(&QueueType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
