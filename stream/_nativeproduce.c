/* Predictions produced and acknowledged in C, and input records consumed in C (see stream/native.py for why and
 * how both are used).
 *
 * A thin binding to the librdkafka that confluent-kafka already loaded: the symbols are looked up at run time
 * (dlopen/dlsym), so no librdkafka headers or second copy of the library are needed. A batch of records is
 * enqueued with one rd_kafka_produce_batch() call from one joined buffer, with the GIL released, and delivery
 * reports are counted here per "slot" (the caller's id for a span of records): no Python object and no GIL per
 * record. The caller polls for slots whose records are all acknowledged, and for failures.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The subset of librdkafka's stable C ABI used here (rdkafka.h). */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_message_s {
    int err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef void (*dr_msg_cb_t)(rd_kafka_t *, const rd_kafka_message_t *, void *);
typedef void (*error_cb_t)(rd_kafka_t *, int, const char *, void *);

#define RD_KAFKA_PRODUCER 0
#define RD_KAFKA_CONSUMER 1
#define RD_KAFKA_CONF_OK 0
#define RD_KAFKA_PARTITION_UA (-1)
#define RD_KAFKA_MSG_F_COPY 0x2
#define RD_KAFKA_RESP_ERR__QUEUE_FULL (-184)
#define RD_KAFKA_RESP_ERR__FATAL (-150)
#define MAX_KEPT_FAILURES 64

static struct {
    rd_kafka_conf_t *(*conf_new)(void);
    int (*conf_set)(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
    void (*conf_set_dr_msg_cb)(rd_kafka_conf_t *, dr_msg_cb_t);
    void (*conf_set_error_cb)(rd_kafka_conf_t *, error_cb_t);
    void (*conf_set_opaque)(rd_kafka_conf_t *, void *);
    void (*conf_destroy)(rd_kafka_conf_t *);
    rd_kafka_t *(*new_)(int, rd_kafka_conf_t *, char *, size_t);
    rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
    void (*topic_destroy)(rd_kafka_topic_t *);
    int (*produce_batch)(rd_kafka_topic_t *, int32_t, int, rd_kafka_message_t *, int);
    int (*poll)(rd_kafka_t *, int);
    int (*flush)(rd_kafka_t *, int);
    int (*outq_len)(rd_kafka_t *);
    void (*destroy)(rd_kafka_t *);
    const char *(*err2str)(int);
    int (*fatal_error)(rd_kafka_t *, char *, size_t);
    int (*last_error)(void);
    /* consumer side */
    int (*type)(const rd_kafka_t *);
    const char *(*name)(const rd_kafka_t *);
    rd_kafka_queue_t *(*queue_new)(rd_kafka_t *);
    rd_kafka_queue_t *(*queue_get_consumer)(rd_kafka_t *);
    rd_kafka_queue_t *(*queue_get_partition)(rd_kafka_t *, const char *, int32_t);
    void (*queue_forward)(rd_kafka_queue_t *, rd_kafka_queue_t *);
    void (*queue_destroy)(rd_kafka_queue_t *);
    void (*queue_yield)(rd_kafka_queue_t *);
    size_t (*queue_length)(rd_kafka_queue_t *);
    void (*queue_cb_event_enable)(rd_kafka_queue_t *, void (*)(rd_kafka_t *, void *), void *);
    ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, rd_kafka_message_t **, size_t);
    void (*message_destroy)(rd_kafka_message_t *);
} rdk;
static int rdk_loaded = 0;

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

static PyObject *mod_load(PyObject *module, PyObject *args) {
    const char *path;
    (void)module;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    if (rdk_loaded)
        Py_RETURN_NONE;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return PyErr_Format(PyExc_ImportError, "cannot load %s: %s", path, dlerror());
#define SYM(field, name)                                                                     \
    if (!(*(void **)&rdk.field = dlsym(h, name)))                                            \
        return PyErr_Format(PyExc_ImportError, "%s has no symbol %s", path, name);
    SYM(conf_new, "rd_kafka_conf_new");
    SYM(conf_set, "rd_kafka_conf_set");
    SYM(conf_set_dr_msg_cb, "rd_kafka_conf_set_dr_msg_cb");
    SYM(conf_set_error_cb, "rd_kafka_conf_set_error_cb");
    SYM(conf_set_opaque, "rd_kafka_conf_set_opaque");
    SYM(conf_destroy, "rd_kafka_conf_destroy");
    SYM(new_, "rd_kafka_new");
    SYM(topic_new, "rd_kafka_topic_new");
    SYM(topic_destroy, "rd_kafka_topic_destroy");
    SYM(produce_batch, "rd_kafka_produce_batch");
    SYM(poll, "rd_kafka_poll");
    SYM(flush, "rd_kafka_flush");
    SYM(outq_len, "rd_kafka_outq_len");
    SYM(destroy, "rd_kafka_destroy");
    SYM(err2str, "rd_kafka_err2str");
    SYM(fatal_error, "rd_kafka_fatal_error");
    SYM(last_error, "rd_kafka_last_error");
    SYM(type, "rd_kafka_type");
    SYM(name, "rd_kafka_name");
    SYM(queue_new, "rd_kafka_queue_new");
    SYM(queue_get_consumer, "rd_kafka_queue_get_consumer");
    SYM(queue_get_partition, "rd_kafka_queue_get_partition");
    SYM(queue_forward, "rd_kafka_queue_forward");
    SYM(queue_destroy, "rd_kafka_queue_destroy");
    SYM(queue_yield, "rd_kafka_queue_yield");
    SYM(queue_length, "rd_kafka_queue_length");
    SYM(queue_cb_event_enable, "rd_kafka_queue_cb_event_enable");
    SYM(consume_batch_queue, "rd_kafka_consume_batch_queue");
    SYM(message_destroy, "rd_kafka_message_destroy");
#undef SYM
    rdk_loaded = 1;
    Py_RETURN_NONE;
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

/* produce(values, ends, keys, slots) -> records enqueued. values: one buffer holding every value back to back;
 * ends: int64 end offset of each value in it; keys: list of bytes or None; slots: int32 slot of each record.
 * A full local queue is waited out by serving delivery reports (1 ms polls) until everything is enqueued or
 * abort() is called; a record librdkafka refuses for another reason is a failure of its slot. */
static PyObject *Producer_produce(Producer *self, PyObject *args) {
    Py_buffer values = {0}, ends = {0}, slots = {0};
    PyObject *keys;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*O!y*", &values, &ends, &PyList_Type, &keys, &slots))
        return NULL;
    Py_ssize_t n = ends.len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *end = ends.buf;
    const int32_t *slot = slots.buf;
    if (ends.len % (Py_ssize_t)sizeof(int64_t) || slots.len != n * (Py_ssize_t)sizeof(int32_t) ||
        PyList_GET_SIZE(keys) != n) {
        PyErr_SetString(PyExc_ValueError, "ends, keys and slots must have one entry per record");
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
    int64_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (end[i] < start || slot[i] < 0 || slot[i] >= self->nslots) {
            PyErr_SetString(PyExc_ValueError, "ends must not decrease and slots must be in range");
            goto out;
        }
        memset(&msgs[i], 0, sizeof msgs[i]);
        msgs[i].payload = (char *)values.buf + start;
        msgs[i].len = (size_t)(end[i] - start);
        start = end[i];
        if (PyBytes_Check(key)) {
            msgs[i].key = PyBytes_AS_STRING(key);
            msgs[i].key_len = (size_t)PyBytes_GET_SIZE(key);
        } else if (key != Py_None) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes or None");
            goto out;
        }
        msgs[i]._private = (void *)(intptr_t)slot[i];
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
        rdk.produce_batch(self->rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, msgs + at, (int)(n - at));
        /* The queue only frees when delivery reports are served, which only this thread does now: once a
         * record finds it full, all after it do too. Retry from the first of those. */
        Py_ssize_t retry_from = n;
        pthread_mutex_lock(&self->lock);
        for (Py_ssize_t i = at; i < n; i++) {
            if (msgs[i].err == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                retry_from = i;
                break;
            }
            if (msgs[i].err)
                record_failure(self, slot[i], msgs[i].err);
        }
        pthread_mutex_unlock(&self->lock);
        at = retry_from;
        if (at < n) {
            for (Py_ssize_t i = at; i < n; i++)
                msgs[i].err = 0;
            rdk.poll(self->rk, 1);
        }
    }
    pthread_mutex_unlock(&self->use);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(at);
out:
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
    int timeout_ms = timeout_s < 0 ? -1 : (int)(timeout_s * 1000.0);
    if (enter(self) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    if (flush)
        rdk.flush(self->rk, timeout_ms);
    else
        rdk.poll(self->rk, timeout_ms);
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
    for (Py_ssize_t i = 0; i < nfail; i++)
        PyList_SET_ITEM(listed, i, Py_BuildValue("(iis)", fslot[i], fcode[i], rdk.err2str(fcode[i])));
    PyObject *fatal_text = Py_None;
    Py_INCREF(Py_None);
    if (fatal && self->rk) {
        char reason[512] = "";
        int code = rdk.fatal_error(self->rk, reason, sizeof reason);
        Py_DECREF(Py_None);
        fatal_text = PyUnicode_FromFormat("%s: %s", rdk.err2str(code), reason);
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
 * still queued is dropped: never acknowledged). take_done()/failures() still report what the flush settled. */
static PyObject *Producer_close(Producer *self, PyObject *args) {
    double timeout_s;
    if (!PyArg_ParseTuple(args, "d", &timeout_s))
        return NULL;
    self->aborting = 1;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->use);
    Py_END_ALLOW_THREADS
    if (!self->rk) {
        pthread_mutex_unlock(&self->use);
        return PyLong_FromLong(0);
    }
    int left;
    Py_BEGIN_ALLOW_THREADS
    rdk.flush(self->rk, timeout_s < 0 ? -1 : (int)(timeout_s * 1000.0));
    left = rdk.outq_len(self->rk);
    destroy_handle(self);
    pthread_mutex_unlock(&self->use);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(left);
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
    .tp_name = "stream._nativeproduce.Producer",
    .tp_basicsize = sizeof(Producer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Producer(config: dict[str, str], topic: str, slots: int)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Producer_init,
    .tp_dealloc = (destructor)Producer_dealloc,
    .tp_methods = Producer_methods,
};

/* ------------------------------------------------------------------------------------------ consumer side
 * Queue(consumer, topic): input records of a confluent_kafka.Consumer taken in C. The fetch queue of each input
 * partition is forwarded ("routed", before the partition is assigned) to a queue of our own; consume() takes up
 * to n records from it with one rd_kafka_consume_batch_queue() call (GIL released) and copies them into one
 * buffer: no Python object per record but its key. librdkafka's own serving of that call keeps what
 * confluent-kafka's consume() does for fetched records (outdated ones after a seek or a revoke are dropped, the
 * consumed position advances, the poll interval is reset). Rebalances, commit results and client errors stay on
 * the consumer's queue, which confluent-kafka's consume() serves (its callbacks need its own call state); when
 * something arrives there, a consume() blocked here returns early and says so ("pending"). */

typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk; /* confluent_kafka's Handle begins so (confluent_kafka.h) */
} HandleHead;

typedef struct {
    PyObject_HEAD
    PyObject *consumer; /* kept alive while the queue is open */
    rd_kafka_t *rk;
    rd_kafka_queue_t *q;  /* ours: the routed partitions' records */
    rd_kafka_queue_t *cq; /* the consumer's queue (a reference to it) */
    char *topic;
    rd_kafka_message_t **msgs;
    Py_ssize_t cap;
} Queue;

/* From a librdkafka thread, on every op put on the consumer's queue: wake a consume() blocked on ours. */
static void on_consumer_queue(rd_kafka_t *rk, void *opaque) {
    (void)rk;
    rdk.queue_yield((rd_kafka_queue_t *)opaque);
}

static int Queue_init(Queue *self, PyObject *args, PyObject *kwargs) {
    static char *kws[] = {"consumer", "topic", NULL};
    PyObject *consumer;
    const char *topic;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Os", kws, &consumer, &topic))
        return -1;
    if (!rdk_loaded) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka is not loaded (call load() first)");
        return -1;
    }
    if (self->q) {
        PyErr_SetString(PyExc_RuntimeError, "already initialised");
        return -1;
    }
    if (Py_TYPE(consumer)->tp_basicsize < (Py_ssize_t)sizeof(HandleHead)) {
        PyErr_SetString(PyExc_TypeError, "not a confluent_kafka.Consumer");
        return -1;
    }
    rd_kafka_t *rk = ((HandleHead *)consumer)->rk;
    if (!rk) {
        PyErr_SetString(PyExc_RuntimeError, "the consumer is closed");
        return -1;
    }
    const char *name = rdk.type(rk) == RD_KAFKA_CONSUMER ? rdk.name(rk) : NULL;
    if (!name || !strstr(name, "#consumer-")) {
        PyErr_SetString(PyExc_TypeError, "not a confluent_kafka.Consumer handle");
        return -1;
    }
    rd_kafka_queue_t *cq = rdk.queue_get_consumer(rk);
    if (!cq) {
        PyErr_SetString(PyExc_ValueError, "the consumer has no group (group.id)");
        return -1;
    }
    self->topic = strdup(topic);
    self->q = rdk.queue_new(rk);
    if (!self->topic || !self->q) {
        rdk.queue_destroy(cq);
        if (self->q)
            rdk.queue_destroy(self->q);
        self->q = NULL;
        PyErr_NoMemory();
        return -1;
    }
    self->cq = cq;
    self->rk = rk;
    Py_INCREF(consumer);
    self->consumer = consumer;
    rdk.queue_cb_event_enable(cq, on_consumer_queue, self->q);
    return 0;
}

static int open_or_raise(Queue *self) {
    if (self->q)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "the native queue is closed");
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

/* consume(n, timeout_s) -> (values, starts, lengths, keys, partitions, offsets, errors, pending)
 * Up to n records (waiting up to timeout_s for n, returning early when the consumer's queue gets something):
 * values back to back in one bytes; starts and lengths int64 bytes (length -1: a null value); keys a list of
 * bytes or None; partitions int32 bytes; offsets int64 bytes; errors [(partition, offset, code, text)] for error
 * events among them (end of partition included); pending: the consumer's queue holds something to serve. */
static PyObject *Queue_consume(Queue *self, PyObject *args) {
    Py_ssize_t max;
    double timeout_s;
    if (!PyArg_ParseTuple(args, "nd", &max, &timeout_s) || open_or_raise(self) < 0)
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
    int timeout_ms = timeout_s <= 0 ? 0 : (int)(timeout_s * 1000.0);
    ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = rdk.consume_batch_queue(self->q, timeout_ms, msgs, (size_t)max);
    Py_END_ALLOW_THREADS
    if (n < 0)
        return PyErr_Format(PyExc_RuntimeError, "consume: %s", rdk.err2str(rdk.last_error()));
    Py_ssize_t good = 0, nerr = 0;
    size_t total = 0;
    for (ssize_t i = 0; i < n; i++) {
        if (msgs[i]->err)
            nerr++;
        else {
            good++;
            total += msgs[i]->payload ? msgs[i]->len : 0;
        }
    }
    PyObject *result = NULL;
    PyObject *values = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    PyObject *starts = PyBytes_FromStringAndSize(NULL, good * 8);
    PyObject *lens = PyBytes_FromStringAndSize(NULL, good * 8);
    PyObject *parts = PyBytes_FromStringAndSize(NULL, good * 4);
    PyObject *offs = PyBytes_FromStringAndSize(NULL, good * 8);
    PyObject *keys = PyList_New(good);
    PyObject *errors = PyList_New(nerr);
    if (values && starts && lens && parts && offs && keys && errors) {
        char *vb = PyBytes_AS_STRING(values);
        int64_t *st = (int64_t *)PyBytes_AS_STRING(starts), *ln = (int64_t *)PyBytes_AS_STRING(lens);
        int32_t *pt = (int32_t *)PyBytes_AS_STRING(parts);
        int64_t *of = (int64_t *)PyBytes_AS_STRING(offs);
        Py_ssize_t g = 0, e = 0, at = 0, failed = 0;
        for (ssize_t i = 0; i < n; i++) {
            const rd_kafka_message_t *m = msgs[i];
            PyObject *item;
            if (m->err) {
                item = m->payload && m->len
                           ? Py_BuildValue("(iLiN)", m->partition, (long long)m->offset, m->err,
                                           PyUnicode_DecodeUTF8(m->payload, (Py_ssize_t)m->len, "replace"))
                           : Py_BuildValue("(iLis)", m->partition, (long long)m->offset, m->err,
                                           rdk.err2str(m->err));
                if (!item) {
                    failed = 1;
                    break;
                }
                PyList_SET_ITEM(errors, e++, item);
                continue;
            }
            if (m->key) {
                item = PyBytes_FromStringAndSize(m->key, (Py_ssize_t)m->key_len);
                if (!item) {
                    failed = 1;
                    break;
                }
            } else {
                item = Py_None;
                Py_INCREF(item);
            }
            PyList_SET_ITEM(keys, g, item);
            st[g] = at;
            if (m->payload) {
                memcpy(vb + at, m->payload, m->len);
                ln[g] = (int64_t)m->len;
                at += (Py_ssize_t)m->len;
            } else
                ln[g] = -1;
            pt[g] = m->partition;
            of[g] = m->offset;
            g++;
        }
        if (!failed)
            result = Py_BuildValue("(OOOOOOOO)", values, starts, lens, keys, parts, offs, errors,
                                   rdk.queue_length(self->cq) > 0 ? Py_True : Py_False);
    }
    /* Records taken from librdkafka are released whatever happened; a failure here fails the caller, whose
     * offsets then stay where their acknowledged predictions put them. */
    for (ssize_t i = 0; i < n; i++)
        rdk.message_destroy(msgs[i]);
    Py_XDECREF(values);
    Py_XDECREF(starts);
    Py_XDECREF(lens);
    Py_XDECREF(parts);
    Py_XDECREF(offs);
    Py_XDECREF(keys);
    Py_XDECREF(errors);
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
    if (self->q)
        rdk.queue_yield(self->q);
    Py_RETURN_NONE;
}

static void queue_close(Queue *self) {
    if (self->q) {
        rdk.queue_cb_event_enable(self->cq, NULL, NULL);
        rdk.queue_destroy(self->cq);
        rdk.queue_destroy(self->q); /* what is still in it is dropped; the routed partitions' records after it too */
        self->q = NULL;
        self->cq = NULL;
        self->rk = NULL;
    }
    Py_CLEAR(self->consumer);
}

/* close(): release the queue. Must come before the consumer's close(), which destroys the client. */
static PyObject *Queue_close(Queue *self, PyObject *noargs) {
    (void)noargs;
    queue_close(self);
    Py_RETURN_NONE;
}

static void Queue_dealloc(Queue *self) {
    queue_close(self);
    free(self->msgs);
    free(self->topic);
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
    .tp_name = "stream._nativeproduce.Queue",
    .tp_basicsize = sizeof(Queue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Queue(consumer: confluent_kafka.Consumer, topic: str)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Queue_init,
    .tp_dealloc = (destructor)Queue_dealloc,
    .tp_methods = Queue_methods,
};

static PyMethodDef module_methods[] = {
    {"load", mod_load, METH_VARARGS, "load(path): bind to the librdkafka shared library at path."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "stream._nativeproduce", NULL, -1, module_methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nativeproduce(void) {
    if (PyType_Ready(&ProducerType) < 0 || PyType_Ready(&QueueType) < 0)
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
    Py_INCREF(&QueueType);
    if (PyModule_AddObject(m, "Queue", (PyObject *)&QueueType) < 0) {
        Py_DECREF(&QueueType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
