/* Predictions produced and acknowledged in C (see stream/kafka/native.py for why and how it is used).
 *
 * A batch of records is enqueued with one rd_kafka_produce_batch() call from one joined buffer, with the GIL
 * released, and delivery reports are counted here per "slot" (the caller's id for a span of records): no Python
 * object and no GIL per record. The caller polls for slots whose records are all acknowledged, and for failures.
 * librdkafka is bound at run time (stream/kafka/_rdkafka.h).
 */
#include "_rdkafka.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEPT_FAILURES 64

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    pthread_mutex_t lock; /* counters below: written by delivery reports, read by the caller */
    pthread_mutex_t use;  /* held while a call uses rk, so close() never destroys it under another call */
    volatile int aborting;
    int64_t *outstanding;
    Py_ssize_t nslots;
    int32_t *done;
    Py_ssize_t ndone;
    int32_t fail_slot[MAX_KEPT_FAILURES];
    int fail_code[MAX_KEPT_FAILURES];
    Py_ssize_t nfail;
    Py_ssize_t failed_total;
    Py_ssize_t queued; /* records librdkafka took whose delivery report has not come yet */
    int fatal;
    rd_kafka_message_t *msgs;
    Py_ssize_t msgs_cap;
} Producer;

static void record_failure(Producer *self, int32_t slot, int code) {
    if (self->nfail < MAX_KEPT_FAILURES) {
        self->fail_slot[self->nfail] = slot;
        self->fail_code[self->nfail] = code;
        self->nfail++;
    }
    self->failed_total++;
}

/* Runs on the thread that polls or flushes, without the GIL. A failed record never counts as acknowledged, so
 * its slot never completes. */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
    Producer *self = opaque;
    int32_t slot = (int32_t)(intptr_t)m->_private;
    (void)rk;
    pthread_mutex_lock(&self->lock);
    self->queued--;
    if (m->err)
        record_failure(self, slot, m->err);
    else if (--self->outstanding[slot] == 0)
        self->done[self->ndone++] = slot;
    pthread_mutex_unlock(&self->lock);
}

/* librdkafka retries everything but fatal errors on its own; a fatal one ends this producer. */
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque) {
    Producer *self = opaque;
    (void)rk;
    (void)reason;
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
        pthread_mutex_lock(&self->lock);
        self->fatal = 1;
        pthread_mutex_unlock(&self->lock);
    }
}


static int Producer_init(Producer *self, PyObject *args, PyObject *kwargs) {
    static char *kws[] = {"config", "topic", "slots", NULL};
    PyObject *config;
    const char *topic;
    Py_ssize_t nslots;
    char errstr[512];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!sn", kws, &PyDict_Type, &config, &topic, &nslots))
        return -1;
    if (!rdk_loaded) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka is not loaded (call load() first)");
        return -1;
    }
    if (self->rk) {
        PyErr_SetString(PyExc_RuntimeError, "already initialised");
        return -1;
    }
    if (nslots < 1 || nslots > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "slots must be in 1..2**24");
        return -1;
    }
    rd_kafka_conf_t *conf = rdk.conf_new();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(config, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        const char *v = PyUnicode_Check(value) ? PyUnicode_AsUTF8(value) : NULL;
        if (!k || !v) {
            rdk.conf_destroy(conf);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "config keys and values must be str");
            return -1;
        }
        if (rdk.conf_set(conf, k, v, errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            rdk.conf_destroy(conf);
            PyErr_Format(PyExc_ValueError, "%s", errstr);
            return -1;
        }
    }
    self->outstanding = calloc((size_t)nslots, sizeof *self->outstanding);
    self->done = calloc((size_t)nslots, sizeof *self->done);
    if (!self->outstanding || !self->done) {
        rdk.conf_destroy(conf);
        PyErr_NoMemory();
        return -1;
    }
    self->nslots = nslots;
    pthread_mutex_init(&self->lock, NULL);
    pthread_mutex_init(&self->use, NULL);
    rdk.conf_set_dr_msg_cb(conf, on_delivery);
    rdk.conf_set_error_cb(conf, on_error);
    rdk.conf_set_opaque(conf, self);
    self->rk = rdk.new_(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr); /* takes conf on success */
    if (!self->rk) {
        rdk.conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "%s", errstr);
        return -1;
    }
    self->rkt = rdk.topic_new(self->rk, topic, NULL);
    if (!self->rkt) {
        PyErr_Format(PyExc_ValueError, "topic %s: %s", topic, rdk.err2str(rdk.last_error()));
        return -1;
    }
    return 0;
}

static void destroy_handle(Producer *self) {
    if (self->rkt)
        rdk.topic_destroy(self->rkt);
    if (self->rk)
        rdk.destroy(self->rk);
    self->rkt = NULL;
    self->rk = NULL;
}

static void Producer_dealloc(Producer *self) {
    if (self->rk) {
        Py_BEGIN_ALLOW_THREADS
        destroy_handle(self);
        Py_END_ALLOW_THREADS
    }
    free(self->outstanding);
    free(self->done);
    free(self->msgs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Takes `use` with the GIL released; fails if the producer is closed. */
static int enter(Producer *self) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->use);
    Py_END_ALLOW_THREADS
    if (!self->rk) {
        pthread_mutex_unlock(&self->use);
        PyErr_SetString(PyExc_RuntimeError, "producer is closed");
        return -1;
    }
    return 0;
}

/* Points msgs[i] at value i of ``values`` (``end``: each value's end offset in it) and at key i of ``keys``
 * (bytes or None), everything else zeroed. -1 with an exception set on bad input. */
static int fill_messages(rd_kafka_message_t *msgs, Py_ssize_t n, const Py_buffer *values, const int64_t *end,
                         PyObject *keys) {
    int64_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (end[i] < start) {
            PyErr_SetString(PyExc_ValueError, "ends must not decrease");
            return -1;
        }
        memset(&msgs[i], 0, sizeof msgs[i]);
        msgs[i].payload = (char *)values->buf + start;
        msgs[i].len = (size_t)(end[i] - start);
        start = end[i];
        if (PyBytes_Check(key)) {
            msgs[i].key = PyBytes_AS_STRING(key);
            msgs[i].key_len = (size_t)PyBytes_GET_SIZE(key);
        } else if (key != Py_None) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes or None");
            return -1;
        }
    }
    return 0;
}

/* Rows [at, end) of msgs enqueued with rd_kafka_produce_batch(); a full local queue is waited out by serving delivery
 * reports (1 ms polls). Returns how far it got: `end`, or less once abort() is called. No GIL. */
static Py_ssize_t enqueue_run(Producer *self, rd_kafka_message_t *msgs, const int32_t *slot, Py_ssize_t at,
                              Py_ssize_t end) {
    while (at < end && !self->aborting) {
        rdk.produce_batch(self->rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, msgs + at, (int)(end - at));
        /* The queue only frees when delivery reports are served, which only this thread does now: once a
         * record finds it full, all after it do too. Retry from the first of those. */
        Py_ssize_t retry_from = end;
        pthread_mutex_lock(&self->lock);
        for (Py_ssize_t i = at; i < end; i++) {
            if (msgs[i].err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                retry_from = i;
                break;
            }
            if (msgs[i].err)
                record_failure(self, slot[i], msgs[i].err);
            else
                self->queued++;
        }
        pthread_mutex_unlock(&self->lock);
        at = retry_from;
        if (at < end) {
            for (Py_ssize_t i = at; i < end; i++)
                msgs[i].err = 0;
            rdk.poll(self->rk, 1);
        }
    }
    return at;
}

/* One record with headers, through rd_kafka_producev() (the batch call takes no headers); librdkafka owns *hdrs
 * once it took the record (*hdrs is then NULL). 0: enqueued, or refused (a failure of its slot); -1: abort() was
 * called while the queue was full. No GIL. */
static int enqueue_one(Producer *self, const rd_kafka_message_t *m, int32_t slot, rd_kafka_headers_t **hdrs) {
    for (;;) {
        int err = rdk.producev(self->rk, RD_KAFKA_VTYPE_RKT, self->rkt, RD_KAFKA_VTYPE_PARTITION,
                               (int32_t)RD_KAFKA_PARTITION_UA, RD_KAFKA_VTYPE_MSGFLAGS, RD_KAFKA_MSG_F_COPY,
                               RD_KAFKA_VTYPE_VALUE, m->payload, m->len, RD_KAFKA_VTYPE_KEY, m->key, m->key_len,
                               RD_KAFKA_VTYPE_OPAQUE, m->_private, RD_KAFKA_VTYPE_HEADERS, *hdrs,
                               RD_KAFKA_VTYPE_END);
        if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            if (self->aborting)
                return -1;
            rdk.poll(self->rk, 1);
            continue;
        }
        pthread_mutex_lock(&self->lock);
        if (err)
            record_failure(self, slot, err);
        else
            self->queued++;
        pthread_mutex_unlock(&self->lock);
        if (!err)
            *hdrs = NULL;
        return 0;
    }
}

/* ``given``: {row: [(name str, value bytes), ...]} -> out[row], a librdkafka header list (out[] starts NULL). -1
 * with an exception set on bad input (the caller destroys what was built). GIL held. */
static int build_headers(PyObject *given, Py_ssize_t n, rd_kafka_headers_t **out) {
    PyObject *row, *list;
    Py_ssize_t pos = 0;
    while (PyDict_Next(given, &pos, &row, &list)) {
        Py_ssize_t i = PyLong_AsSsize_t(row);
        if (i == -1 && PyErr_Occurred())
            return -1;
        if (i < 0 || i >= n || out[i] || !PyList_Check(list)) {
            PyErr_SetString(PyExc_ValueError, "headers must be {row: [(name, value), ...]} with rows in range");
            return -1;
        }
        Py_ssize_t k = PyList_GET_SIZE(list);
        out[i] = rdk.headers_new((size_t)(k ? k : 1));
        for (Py_ssize_t j = 0; j < k; j++) {
            PyObject *pair = PyList_GET_ITEM(list, j);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) ||
                !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
                PyErr_SetString(PyExc_TypeError, "a header must be a (str, bytes) tuple");
                return -1;
            }
            Py_ssize_t name_len;
            const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &name_len);
            if (!name)
                return -1;
            PyObject *value = PyTuple_GET_ITEM(pair, 1);
            rdk.header_add(out[i], name, name_len, PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
        }
    }
    return 0;
}

/* produce(values, ends, keys, slots[, headers]) -> records enqueued. values: one buffer holding every value back to
 * back; ends: int64 end offset of each value in it; keys: list of bytes or None; slots: int32 slot of each record;
 * headers: {row: [(name, value bytes), ...]} of the rows that carry any (None: none does). Records are enqueued in
 * row order: runs of rows without headers in one batch call each, a row with headers on its own. A full local
 * queue is waited out by serving delivery reports (1 ms polls) until everything is enqueued or abort() is called;
 * a record librdkafka refuses for another reason is a failure of its slot. */
static PyObject *Producer_produce(Producer *self, PyObject *args) {
    Py_buffer values = {0}, ends = {0}, slots = {0};
    PyObject *keys, *given = Py_None;
    PyObject *result = NULL;
    rd_kafka_headers_t **hdrs = NULL;
    if (!PyArg_ParseTuple(args, "y*y*O!y*|O", &values, &ends, &PyList_Type, &keys, &slots, &given))
        return NULL;
    Py_ssize_t n = ends.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *end = ends.buf;
    const int32_t *slot = slots.buf;
    if (ends.len % (Py_ssize_t)sizeof(int64_t) || slots.len != n * (Py_ssize_t)sizeof(int32_t) ||
        PyList_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "ends, keys and slots must have one entry per record");
        goto out;
    }
    if (given != Py_None && !PyDict_Check(given)) {
        PyErr_SetString(PyExc_TypeError, "headers must be a dict or None");
        goto out;
    }
    if (n && (end[n - 1] > values.len)) {
        PyErr_SetString(PyExc_ValueError, "ends run past the values buffer");
        goto out;
    }
    if (self->msgs_cap < n) {
        rd_kafka_message_t *grown = realloc(self->msgs, (size_t)n * sizeof *grown);
        if (!grown) {
            PyErr_NoMemory();
            goto out;
        }
        self->msgs = grown;
        self->msgs_cap = n;
    }
    rd_kafka_message_t *msgs = self->msgs;
    if (fill_messages(msgs, n, &values, end, keys) < 0)
        goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (slot[i] < 0 || slot[i] >= self->nslots) {
            PyErr_SetString(PyExc_ValueError, "slots must be in range");
            goto out;
        }
        msgs[i]._private = (void *)(intptr_t)slot[i];
    }
    if (given != Py_None && PyDict_GET_SIZE(given)) {
        hdrs = calloc(n ? (size_t)n : 1, sizeof *hdrs);
        if (!hdrs) {
            PyErr_NoMemory();
            goto out;
        }
        if (build_headers(given, n, hdrs) < 0)
            goto out;
    }
    if (enter(self) < 0)
        goto out;
    /* Count every record before any can be acknowledged, so no slot completes while its records are queued. */
    pthread_mutex_lock(&self->lock);
    for (Py_ssize_t i = 0; i < n; i++)
        self->outstanding[slot[i]]++;
    pthread_mutex_unlock(&self->lock);
    Py_ssize_t at = 0;
    Py_BEGIN_ALLOW_THREADS
    while (at < n && !self->aborting) {
        Py_ssize_t run = at;
        while (run < n && !(hdrs && hdrs[run]))
            run++;
        if (run > at && (at = enqueue_run(self, msgs, slot, at, run)) < run)
            break;
        if (at < n) {
            if (enqueue_one(self, &msgs[at], slot[at], &hdrs[at]) < 0)
                break;
            at++;
        }
    }
    pthread_mutex_unlock(&self->use);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(at);
out:
    if (hdrs) {
        for (Py_ssize_t i = 0; i < n; i++)
            if (hdrs[i])
                rdk.headers_destroy(hdrs[i]);
        free(hdrs);
    }
    PyBuffer_Release(&values);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&slots);
    return result;
}

/* Slots completed since the last call, as int32 bytes. */
static PyObject *take_done(Producer *self) {
    pthread_mutex_lock(&self->lock);
    PyObject *out = PyBytes_FromStringAndSize((const char *)self->done, self->ndone * (Py_ssize_t)sizeof(int32_t));
    self->ndone = 0;
    pthread_mutex_unlock(&self->lock);
    return out;
}

static PyObject *serve(Producer *self, PyObject *args, int flush) {
    double timeout_s;
    if (!PyArg_ParseTuple(args, "d", &timeout_s))
        return NULL;
    const int wait_ms = timeout_ms(timeout_s, -1);
    if (PyErr_Occurred() || enter(self) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    if (flush)
        rdk.flush(self->rk, wait_ms);
    else
        rdk.poll(self->rk, wait_ms);
    pthread_mutex_unlock(&self->use);
    Py_END_ALLOW_THREADS
    return take_done(self);
}

static PyObject *Producer_poll(Producer *self, PyObject *args) { return serve(self, args, 0); }
static PyObject *Producer_flush(Producer *self, PyObject *args) { return serve(self, args, 1); }

static PyObject *Producer_take_done(Producer *self, PyObject *noargs) {
    (void)noargs;
    return take_done(self);
}

/* ([(slot, error code, error text)], failures in all, fatal error text or None): failures since the last call
 * (the first MAX_KEPT_FAILURES of them listed; the count is of all). */
static PyObject *Producer_failures(Producer *self, PyObject *noargs) {
    (void)noargs;
    pthread_mutex_lock(&self->lock);
    Py_ssize_t nfail = self->nfail, total = self->failed_total;
    int32_t fslot[MAX_KEPT_FAILURES];
    int fcode[MAX_KEPT_FAILURES];
    memcpy(fslot, self->fail_slot, sizeof fslot);
    memcpy(fcode, self->fail_code, sizeof fcode);
    int fatal = self->fatal;
    self->nfail = 0;
    self->failed_total = 0;
    self->fatal = 0;
    pthread_mutex_unlock(&self->lock);
    PyObject *listed = PyList_New(nfail);
    if (!listed)
        return NULL;
    for (Py_ssize_t i = 0; i < nfail; i++) {
        PyObject *item = Py_BuildValue("(iis)", fslot[i], fcode[i], rdk.err2str(fcode[i]));
        if (!item) {
            Py_DECREF(listed);
            return NULL;
        }
        PyList_SET_ITEM(listed, i, item);
    }
    PyObject *fatal_text = Py_None;
    Py_INCREF(Py_None);
    if (fatal && self->rk) {
        char reason[512] = "";
        int code = rdk.fatal_error(self->rk, reason, sizeof reason);
        Py_DECREF(Py_None);
        fatal_text = PyUnicode_FromFormat("%s: %s", rdk.err2str(code), reason);
        if (!fatal_text) {
            Py_DECREF(listed);
            return NULL;
        }
    }
    return Py_BuildValue("(NnN)", listed, total, fatal_text);
}

static PyObject *Producer_outq_len(Producer *self, PyObject *noargs) {
    (void)noargs;
    if (enter(self) < 0)
        return NULL;
    int len = rdk.outq_len(self->rk);
    pthread_mutex_unlock(&self->use);
    return PyLong_FromLong(len);
}

/* Makes a produce() that waits for queue space return now (from any thread). */
static PyObject *Producer_abort(Producer *self, PyObject *noargs) {
    (void)noargs;
    self->aborting = 1;
    Py_RETURN_NONE;
}

/* close(timeout_s) -> records still undelivered: flushes for up to timeout_s, then destroys the handle (what is
 * still queued is dropped: never acknowledged). take_done()/failures() still report what the flush settled. The
 * count is of records with no delivery report yet, not librdkafka's outq_len, which also counts its own requests
 * and events (with the broker unreachable, a metadata request could be counted as a record left). */
static PyObject *Producer_close(Producer *self, PyObject *args) {
    double timeout_s;
    if (!PyArg_ParseTuple(args, "d", &timeout_s))
        return NULL;
    const int wait_ms = timeout_ms(timeout_s, -1);
    if (PyErr_Occurred())
        return NULL;
    self->aborting = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->use);
    Py_END_ALLOW_THREADS
    if (!self->rk) {
        pthread_mutex_unlock(&self->use);
        return PyLong_FromLong(0);
    }
    Py_ssize_t left;
    Py_BEGIN_ALLOW_THREADS
    rdk.flush(self->rk, wait_ms);
    pthread_mutex_lock(&self->lock);
    left = self->queued;
    pthread_mutex_unlock(&self->lock);
    destroy_handle(self);
    pthread_mutex_unlock(&self->use);
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(left);
}

static PyMethodDef Producer_methods[] = {
    {"produce", (PyCFunction)Producer_produce, METH_VARARGS, "Enqueue a batch; returns how many were enqueued."},
    {"poll", (PyCFunction)Producer_poll, METH_VARARGS, "Serve delivery reports; returns completed slots."},
    {"flush", (PyCFunction)Producer_flush, METH_VARARGS, "Send now and serve reports; returns completed slots."},
    {"take_done", (PyCFunction)Producer_take_done, METH_NOARGS, "Completed slots not yet returned."},
    {"failures", (PyCFunction)Producer_failures, METH_NOARGS, "Failures since the last call."},
    {"outq_len", (PyCFunction)Producer_outq_len, METH_NOARGS, "Records not yet settled."},
    {"abort", (PyCFunction)Producer_abort, METH_NOARGS, "Stop waiting for queue space."},
    {"close", (PyCFunction)Producer_close, METH_VARARGS, "Flush, then destroy; returns undelivered count."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProducerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stream.kafka._nativeproduce.Producer",
    .tp_basicsize = sizeof(Producer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Producer(config: dict[str, str], topic: str, slots: int)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Producer_init,
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_methods = Producer_methods,
};

/* produce_into(producer, topic, values, ends, keys) -> (enqueued, error): records enqueued on a
 * confluent_kafka.Producer's own librdkafka handle (its transaction, if one is open) with one
 * rd_kafka_produce_batch() call, GIL released, and no delivery-report state: confluent-kafka's delivery callback
 * ignores a record without one, and a transaction's commit is what acknowledges them. Stops at the first record
 * librdkafka refuses: ``enqueued`` records went in, ``error`` is its code (0: all went in; the caller serves the
 * producer and calls again with the rest when it is _QUEUE_FULL). The caller keeps the producer open and used
 * by no other thread meanwhile. */
static PyObject *produce_into(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *producer, *keys, *result = NULL;
    const char *topic;
    Py_buffer values = {0}, ends = {0};
    if (!PyArg_ParseTuple(args, "Osy*y*O!", &producer, &topic, &values, &ends, &PyList_Type, &keys))
        return NULL;
    Py_ssize_t n = ends.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *end = ends.buf;
    rd_kafka_message_t *msgs = NULL;
    rd_kafka_t *rk = client_handle(producer, "Producer", RD_KAFKA_PRODUCER);
    if (!rk)
        goto out;
    if (ends.len % (Py_ssize_t)sizeof(int64_t) || PyList_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "ends and keys must have one entry per record");
        goto out;
    }
    if (n && end[n - 1] > values.len) {
        PyErr_SetString(PyExc_ValueError, "ends run past the values buffer");
        goto out;
    }
    msgs = calloc(n ? (size_t)n : 1, sizeof *msgs);
    if (!msgs) {
        PyErr_NoMemory();
        goto out;
    }
    if (fill_messages(msgs, n, &values, end, keys) < 0)
        goto out;
    Py_ssize_t enqueued = n;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    rd_kafka_topic_t *rkt = rdk.topic_new(rk, topic, NULL);
    if (!rkt) {
        enqueued = 0;
        error = RD_KAFKA_RESP_ERR__INVALID_ARG;
    } else {
        if (n)
            rdk.produce_batch(rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, msgs, (int)n);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (msgs[i].err) {
                enqueued = i;
                error = msgs[i].err;
                break;
            }
        }
        rdk.topic_destroy(rkt);
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(ni)", enqueued, error);
out:
    free(msgs);
    PyBuffer_Release(&values);
    PyBuffer_Release(&ends);
    return result;
}

static PyMethodDef module_methods[] = {
    {"load", rdk_load, METH_VARARGS, "load(path): bind to the librdkafka shared library at path."},
    {"produce_into", produce_into, METH_VARARGS,
     "produce_into(producer, topic, values, ends, keys) -> (enqueued, error): into a confluent_kafka.Producer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "stream.kafka._nativeproduce", NULL, -1, module_methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nativeproduce(void) {
    if (PyType_Ready(&ProducerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&ProducerType);
    if (PyModule_AddObject(m, "Producer", (PyObject *)&ProducerType) < 0) {
        Py_DECREF(&ProducerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
