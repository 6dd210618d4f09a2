/* The subset of librdkafka's C API that stream/kafka/_nativeproduce.c and stream/kafka/_nativeconsume.c use, and its loader.
 *
 * Both bind at run time to the librdkafka that confluent-kafka already loaded: the symbols are looked up with
 * dlopen/dlsym (stream/kafka/native.py finds the library's path), so no librdkafka headers or second copy of the library
 * are needed. Each extension includes this header and so keeps its own table (`rdk`), filled by its module's
 * load(path) (`rdk_load`).
 */
#ifndef STREAM_RDKAFKA_H
#define STREAM_RDKAFKA_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <dlfcn.h>
#include <stdint.h>

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
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef void (*dr_msg_cb_t)(rd_kafka_t *, const rd_kafka_message_t *, void *);
typedef void (*error_cb_t)(rd_kafka_t *, int, const char *, void *);

#define RD_KAFKA_PRODUCER 0
#define RD_KAFKA_CONSUMER 1
#define RD_KAFKA_CONF_OK 0
#define RD_KAFKA_PARTITION_UA (-1)
#define RD_KAFKA_MSG_F_COPY 0x2
#define RD_KAFKA_RESP_ERR__QUEUE_FULL (-184)
#define RD_KAFKA_RESP_ERR__FATAL (-150)
#define RD_KAFKA_RESP_ERR__INVALID_ARG (-186)
/* rd_kafka_producev()'s argument tags (rd_kafka_vtype_t) */
#define RD_KAFKA_VTYPE_END 0
#define RD_KAFKA_VTYPE_RKT 2
#define RD_KAFKA_VTYPE_PARTITION 3
#define RD_KAFKA_VTYPE_VALUE 4
#define RD_KAFKA_VTYPE_KEY 5
#define RD_KAFKA_VTYPE_OPAQUE 6
#define RD_KAFKA_VTYPE_MSGFLAGS 7
#define RD_KAFKA_VTYPE_HEADERS 10

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
    int (*producev)(rd_kafka_t *, ...);
    rd_kafka_headers_t *(*headers_new)(size_t);
    int (*header_add)(rd_kafka_headers_t *, const char *, ssize_t, const void *, ssize_t);
    void (*headers_destroy)(rd_kafka_headers_t *);
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
    int (*message_detach_headers)(rd_kafka_message_t *, rd_kafka_headers_t **);
    size_t (*header_cnt)(const rd_kafka_headers_t *);
    int (*header_get_all)(const rd_kafka_headers_t *, size_t, const char **, const void **, size_t *);
    int64_t (*message_timestamp)(const rd_kafka_message_t *, int *); /* -1: none; the int: its type */
} rdk;
static int rdk_loaded = 0;

static PyObject *rdk_load(PyObject *module, PyObject *args) {
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
    SYM(producev, "rd_kafka_producev");
    SYM(headers_new, "rd_kafka_headers_new");
    SYM(header_add, "rd_kafka_header_add");
    SYM(headers_destroy, "rd_kafka_headers_destroy");
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
    SYM(message_detach_headers, "rd_kafka_message_detach_headers");
    SYM(header_cnt, "rd_kafka_header_cnt");
    SYM(header_get_all, "rd_kafka_header_get_all");
    SYM(message_timestamp, "rd_kafka_message_timestamp");
#undef SYM
    rdk_loaded = 1;
    Py_RETURN_NONE;
}

/* A timeout in seconds as librdkafka's int milliseconds, clamped (a NaN or an infinity is no undefined cast):
 * negative is `negative_ms` (-1: wait without end, 0: do not wait); 0 on a NaN, with a ValueError set. */
static int timeout_ms(double timeout_s, int negative_ms) {
    if (timeout_s != timeout_s) {
        PyErr_SetString(PyExc_ValueError, "a timeout cannot be NaN");
        return 0;
    }
    if (timeout_s < 0)
        return negative_ms;
    return timeout_s * 1000.0 >= (double)INT_MAX ? INT_MAX : (int)(timeout_s * 1000.0);
}

/* confluent_kafka's client objects (cimpl's Handle) begin with the librdkafka handle, NULL once closed. */
typedef struct {
    PyObject_HEAD
    rd_kafka_t *rk;
} HandleHead;

/* The librdkafka handle of `client`, which must be an open confluent_kafka.<kind> ("Consumer" or "Producer",
 * rd_type RD_KAFKA_CONSUMER or _PRODUCER): checked by its type, not its size, before the handle is read; NULL with
 * an exception set otherwise. */
static rd_kafka_t *client_handle(PyObject *client, const char *kind, int rd_type) {
    if (!rdk_loaded) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka is not loaded (call load() first)");
        return NULL;
    }
    PyObject *cimpl = PyImport_ImportModule("confluent_kafka.cimpl");
    if (!cimpl)
        return NULL;
    PyObject *type = PyObject_GetAttrString(cimpl, kind);
    Py_DECREF(cimpl);
    if (!type)
        return NULL;
    const int ok = PyType_Check(type) && PyObject_TypeCheck(client, (PyTypeObject *)type) &&
                   ((PyTypeObject *)type)->tp_basicsize >= (Py_ssize_t)sizeof(HandleHead);
    Py_DECREF(type);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "a confluent_kafka.%s is needed, not %s", kind, Py_TYPE(client)->tp_name);
        return NULL;
    }
    rd_kafka_t *rk = ((HandleHead *)client)->rk;
    if (!rk) {
        PyErr_Format(PyExc_RuntimeError, "the %s is closed", kind);
        return NULL;
    }
    if (rdk.type(rk) != rd_type) {
        PyErr_Format(PyExc_TypeError, "not a librdkafka %s handle", kind);
        return NULL;
    }
    return rk;
}

#endif
