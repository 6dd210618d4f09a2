/* The text model's host path in C, for `stream.models.minilm`: BERT's WordPiece tokenizing of ASCII texts
 * (`WordPiece`, most of this file; `encode` takes str, `encode_spans` a batch's UTF-8 bytes and each text's span),
 * the blank-text check of `stream.models.text_buffer` (`unsure_blank`) and the pass planner's dynamic programme
 * (`plan_groups`, at the end).
 *
 * WordPiece gives exactly the ids the Rust `tokenizers` library gives for a tokenizer.json of BertNormalizer
 * (clean_text, lowercase; its Chinese-character and accent handling touch no ASCII character), BertPreTokenizer
 * and a WordPiece model, with [CLS] ... [SEP] around, for the texts it accepts: pure ASCII (Python's own flag on
 * the str, read in O(1)) without a '[' (where a special token such as "[SEP]" written in the text would be
 * matched whole by the library's added vocabulary). Every other text is left to the library: `encode` lists
 * them, and the caller tokenizes those there. tests/unit/models/test_wordpiece.py holds the two to the same ids.
 *
 * Why: the library costs about 40 us a short text on this project's machine, most of it bookkeeping (each
 * character's alignment to the input, an Encoding object, a Python list of its ids) that a model needing only
 * ids never reads; it was the largest part of the worker's host path per text. Here a batch costs a few us a
 * text, the ids come back as one int32 buffer (no Python int per token), and the work runs without the GIL, so
 * several prepare threads tokenize at once.
 *
 * The steps, on the bytes of each text (at most `max_chars` of them, as the caller cuts long texts):
 *   normalizing: control characters (below 0x20 but tab, newline and carriage return; 0x7F) are removed, those
 *     three become spaces, A-Z become a-z;
 *   pre-tokenizing: words are split at spaces (removed) and at ASCII punctuation (each character its own word);
 *   WordPiece: a word longer than `max_word_chars` is [UNK]; otherwise greedily the longest vocabulary prefix,
 *     then the longest continuation ("##" + rest) from where it ended, ...; a word with a rest no entry covers
 *     is one [UNK];
 *   then [CLS] + the word pieces + [SEP], cut to `max_tokens` with [SEP] kept last.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_WORD 512 /* max_word_chars at most: a word's bytes kept for lookup (a longer word is [UNK]) */

typedef struct {
    const char *key; /* into the table's arena; NULL: an empty slot */
    Py_ssize_t len;
    int32_t id;
} Entry;

typedef struct {
    Entry *slots;
    size_t mask;
    char *arena;
    size_t used;
} Table;

static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int table_init(Table *t, size_t count, size_t bytes) {
    size_t size = 16;
    while (size < 2 * count) size <<= 1;
    t->slots = PyMem_Calloc(size, sizeof(Entry));
    t->arena = PyMem_Malloc(bytes ? bytes : 1);
    t->mask = size - 1;
    t->used = 0;
    if (t->slots == NULL || t->arena == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void table_free(Table *t) {
    PyMem_Free(t->slots);
    PyMem_Free(t->arena);
    t->slots = NULL;
    t->arena = NULL;
}

/* The first entry of a key wins, as a dict has one entry per key. */
static void table_put(Table *t, const char *key, Py_ssize_t len, int32_t id) {
    size_t i = (size_t)hash_bytes(key, len) & t->mask;
    while (t->slots[i].key != NULL) {
        if (t->slots[i].len == len && memcmp(t->slots[i].key, key, (size_t)len) == 0) return;
        i = (i + 1) & t->mask;
    }
    char *copy = t->arena + t->used;
    memcpy(copy, key, (size_t)len);
    t->used += (size_t)len;
    t->slots[i].key = copy;
    t->slots[i].len = len;
    t->slots[i].id = id;
}

static int32_t table_get(const Table *t, const char *key, Py_ssize_t len) {
    size_t i = (size_t)hash_bytes(key, len) & t->mask;
    while (t->slots[i].key != NULL) {
        if (t->slots[i].len == len && memcmp(t->slots[i].key, key, (size_t)len) == 0) return t->slots[i].id;
        i = (i + 1) & t->mask;
    }
    return -1;
}

typedef struct {
    PyObject_HEAD
    Table starts; /* pieces a word may start with */
    Table conts;  /* continuations, without their prefix */
    int32_t unk, cls, sep;
    Py_ssize_t max_word_chars;
    int ready; /* __init__ finished: encode reads the tables (without the GIL), which never change after */
} WordPiece;

static void wp_dealloc(WordPiece *self) {
    table_free(&self->starts);
    table_free(&self->conts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* WordPiece(vocab: dict[str, int], unk_id, cls_id, sep_id, max_word_chars, prefix="##") */
static int wp_init(WordPiece *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"vocab", "unk_id", "cls_id", "sep_id", "max_word_chars", "prefix", NULL};
    PyObject *vocab;
    int unk, cls, sep;
    Py_ssize_t max_word_chars;
    const char *prefix = "##";
    Py_ssize_t prefix_len = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!iiin|s#", names, &PyDict_Type, &vocab, &unk, &cls, &sep,
                                     &max_word_chars, &prefix, &prefix_len))
        return -1;
    if (max_word_chars < 1 || max_word_chars > MAX_WORD) {
        PyErr_Format(PyExc_ValueError, "max_word_chars must be between 1 and %d", MAX_WORD);
        return -1;
    }
    if (self->ready || self->starts.slots != NULL) {
        /* The tables are read without the GIL by encode on other threads: they are never freed while it lives. */
        PyErr_SetString(PyExc_TypeError, "a WordPiece is initialised once: make a new one");
        return -1;
    }
    size_t n_starts = 0, n_conts = 0, b_starts = 0, b_conts = 0;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    Table starts = {0}, conts = {0};
    for (int pass = 0; pass < 2; pass++) {
        pos = 0;
        while (PyDict_Next(vocab, &pos, &key, &value)) {
            if (!PyUnicode_Check(key) || !PyLong_Check(value)) {
                PyErr_SetString(PyExc_TypeError, "vocab: str keys and int values");
                goto fail;
            }
            if (!PyUnicode_IS_ASCII(key)) continue; /* never matched by an ASCII word */
            Py_ssize_t len = PyUnicode_GET_LENGTH(key);
            const char *s = (const char *)PyUnicode_1BYTE_DATA(key);
            long id = PyLong_AsLong(value);
            if (id == -1 && PyErr_Occurred()) goto fail;
            if (id < 0 || id > INT32_MAX) {
                PyErr_Format(PyExc_ValueError, "vocab: id %ld of %R out of range", id, key);
                goto fail;
            }
            int cont = prefix_len > 0 && len > prefix_len && memcmp(s, prefix, (size_t)prefix_len) == 0;
            if (pass == 0) {
                if (cont) {
                    n_conts++;
                    b_conts += (size_t)(len - prefix_len);
                } else {
                    n_starts++;
                    b_starts += (size_t)len;
                }
            } else if (cont) {
                table_put(&conts, s + prefix_len, len - prefix_len, (int32_t)id);
            } else {
                table_put(&starts, s, len, (int32_t)id);
            }
        }
        if (pass == 0 && (table_init(&starts, n_starts, b_starts) < 0 || table_init(&conts, n_conts, b_conts) < 0))
            goto fail;
    }
    self->starts = starts;
    self->conts = conts;
    self->unk = unk;
    self->cls = cls;
    self->sep = sep;
    self->max_word_chars = max_word_chars;
    self->ready = 1;
    return 0;
fail:
    table_free(&starts);
    table_free(&conts);
    return -1;
}

/* Appends the word's pieces to out[*count...] (never past `room` ids); 0, or 1 once `room` is reached. */
static int word_pieces(const WordPiece *self, const char *word, Py_ssize_t n, int32_t *out, Py_ssize_t *count,
                       Py_ssize_t room) {
    int32_t pieces[MAX_WORD];
    Py_ssize_t found = 0;
    if (n > self->max_word_chars) { /* <= MAX_WORD (checked at init) */
        pieces[found++] = self->unk;
    } else {
        Py_ssize_t start = 0;
        while (start < n) {
            const Table *t = start == 0 ? &self->starts : &self->conts;
            int32_t id = -1;
            Py_ssize_t end = n;
            for (; end > start; end--) {
                id = table_get(t, word + start, end - start);
                if (id >= 0) break;
            }
            if (id < 0) {
                found = 0;
                pieces[found++] = self->unk;
                break;
            }
            pieces[found++] = id;
            start = end;
        }
    }
    for (Py_ssize_t i = 0; i < found; i++) {
        if (*count >= room) return 1;
        out[(*count)++] = pieces[i];
    }
    return 0;
}

static inline int is_punct(unsigned char c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
}

/* One text's ids into out (room for max_tokens); returns how many; *cut set when ids were dropped. */
static Py_ssize_t encode_one(const WordPiece *self, const char *s, Py_ssize_t n, Py_ssize_t max_tokens, int32_t *out,
                             int *cut) {
    char word[MAX_WORD];
    Py_ssize_t w = 0, long_word = 0; /* long_word: the word's length past MAX_WORD (it is [UNK] whatever) */
    Py_ssize_t count = 1;
    Py_ssize_t room = max_tokens; /* one more content id than fits: its presence means a cut */
    out[0] = self->cls;
    int full = 0;
    for (Py_ssize_t i = 0; i <= n && !full; i++) {
        unsigned char c = i < n ? (unsigned char)s[i] : ' ';
        if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) continue; /* removed */
        int space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
        int punct = is_punct(c);
        if (space || punct) {
            if (w + long_word > 0)
                full = word_pieces(self, word, w + long_word, out, &count, room);
            w = long_word = 0;
            if (punct && !full) {
                char p = (char)c;
                full = word_pieces(self, &p, 1, out, &count, room);
            }
            continue;
        }
        if (w < MAX_WORD) word[w++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        else long_word++;
    }
    *cut = full || count > max_tokens - 1;
    if (count > max_tokens - 1) count = max_tokens - 1;
    out[count++] = self->sep;
    return count;
}

static int accepted(PyObject *text, Py_ssize_t max_chars) {
    if (!PyUnicode_IS_ASCII(text)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (n > max_chars) n = max_chars;
    return memchr(PyUnicode_1BYTE_DATA(text), '[', (size_t)n) == NULL;
}

/* A contiguous read-only buffer of int64 of at least `count` items (its own count: view->len / 8). */
static int int64_buf(PyObject *obj, Py_buffer *view, Py_ssize_t count, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 8 || view->format == NULL || (strcmp(view->format, "q") && strcmp(view->format, "l")) ||
        view->len < 8 * count) {
        PyErr_Format(PyExc_ValueError, "%s: need %zd int64 items", name, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Whether `encode`'s or `encode_spans`' arguments are refused (the error set). */
static int encode_refused(const WordPiece *self, Py_ssize_t max_tokens, Py_ssize_t max_chars) {
    if (!self->ready) {
        PyErr_SetString(PyExc_TypeError, "this WordPiece was not initialised");
        return 1;
    }
    if (max_tokens < 2 || max_tokens > 65536 || max_chars < 0) {
        PyErr_SetString(PyExc_ValueError, "max_tokens must be between 2 and 65536 and max_chars not negative");
        return 1;
    }
    return 0;
}

/* encode(texts, max_tokens, max_chars) -> (ids: bytes of int32, lengths: bytes of int32, others: list[int],
 * cut: int). Each accepted text's ids, [CLS] ... [SEP] cut to max_tokens, one after another in `ids`, its count in
 * `lengths`; a text not accepted (see the top of this file) gets length 0 and its index in `others`. `cut`: the
 * accepted texts longer than max_chars or cut to max_tokens. */
static PyObject *wp_encode(WordPiece *self, PyObject *args) {
    PyObject *seq;
    Py_ssize_t max_tokens, max_chars;
    if (!PyArg_ParseTuple(args, "Onn", &seq, &max_tokens, &max_chars)) return NULL;
    if (encode_refused(self, max_tokens, max_chars)) return NULL;
    PyObject *fast = PySequence_Fast(seq, "texts must be a sequence of str");
    if (fast == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(PyObject *));
    int32_t *ids = PyMem_Malloc((size_t)(n ? n : 1) * (size_t)max_tokens * sizeof(int32_t));
    int32_t *lengths = PyMem_Calloc((size_t)(n ? n : 1), sizeof(int32_t));
    char *take = PyMem_Calloc((size_t)(n ? n : 1), 1);
    PyObject *others = PyList_New(0), *result = NULL;
    Py_ssize_t held = 0, total = 0, cut = 0;
    if (items == NULL || ids == NULL || lengths == NULL || take == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (others == NULL) goto done;
    for (; held < n; held++) { /* our own references: the list may change while the GIL is released */
        PyObject *text = PySequence_Fast_GET_ITEM(fast, held);
        if (!PyUnicode_Check(text) || PyUnicode_READY(text) < 0) {
            if (PyErr_Occurred()) goto done;
            PyErr_Format(PyExc_TypeError, "texts[%zd] is %.100s, not str", held, Py_TYPE(text)->tp_name);
            goto done;
        }
        Py_INCREF(text);
        items[held] = text;
        take[held] = (char)accepted(text, max_chars);
        if (!take[held]) {
            PyObject *index = PyLong_FromSsize_t(held);
            if (index == NULL || PyList_Append(others, index) < 0) {
                Py_XDECREF(index);
                held++;
                goto done;
            }
            Py_DECREF(index);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!take[i]) continue;
        Py_ssize_t len = PyUnicode_GET_LENGTH(items[i]);
        int was_cut = 0;
        Py_ssize_t count = encode_one(self, (const char *)PyUnicode_1BYTE_DATA(items[i]),
                                      len > max_chars ? max_chars : len, max_tokens, ids + total, &was_cut);
        lengths[i] = (int32_t)count;
        total += count;
        cut += was_cut || len > max_chars;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(y#y#On)", (const char *)ids, total * (Py_ssize_t)sizeof(int32_t), (const char *)lengths,
                           n * (Py_ssize_t)sizeof(int32_t), others, cut);
done:
    for (Py_ssize_t i = 0; i < held; i++) Py_DECREF(items[i]);
    PyMem_Free(items);
    PyMem_Free(ids);
    PyMem_Free(lengths);
    PyMem_Free(take);
    Py_XDECREF(others);
    Py_DECREF(fast);
    return result;
}

/* The spans [starts[i], ends[i]) of `data` as texts: checked, and each one's bytes found (a view into data). */
typedef struct {
    Py_buffer data, starts, ends;
    Py_ssize_t n;
} Spans;

static void spans_release(Spans *sp) {
    PyBuffer_Release(&sp->data);
    PyBuffer_Release(&sp->starts);
    PyBuffer_Release(&sp->ends);
}

static int spans_get(PyObject *data, PyObject *starts, PyObject *ends, Spans *sp) {
    memset(sp, 0, sizeof *sp);
    if (PyObject_GetBuffer(data, &sp->data, PyBUF_SIMPLE) < 0) return -1;
    if (int64_buf(starts, &sp->starts, 0, "starts") < 0) {
        PyBuffer_Release(&sp->data);
        return -1;
    }
    sp->n = sp->starts.len / 8;
    if (int64_buf(ends, &sp->ends, sp->n, "ends") < 0) {
        PyBuffer_Release(&sp->data);
        PyBuffer_Release(&sp->starts);
        return -1;
    }
    const int64_t *a = sp->starts.buf, *b = sp->ends.buf;
    for (Py_ssize_t i = 0; i < sp->n; i++)
        if (a[i] < 0 || b[i] < a[i] || b[i] > sp->data.len) {
            PyErr_Format(PyExc_ValueError, "span %zd [%lld, %lld) is not within the data's %zd bytes", i,
                         (long long)a[i], (long long)b[i], sp->data.len);
            spans_release(sp);
            return -1;
        }
    return 0;
}

/* encode_spans(data, starts, ends, max_tokens, max_chars) -> `encode`'s result for the UTF-8 texts
 * data[starts[i]:ends[i]] (starts and ends int64 buffers of one count), without a str per text: a text is
 * accepted when all its bytes are ASCII and none of its first max_chars is '[', as `encode` accepts a str. The
 * whole batch is read and tokenized without the GIL. */
static PyObject *wp_encode_spans(WordPiece *self, PyObject *args) {
    PyObject *data, *starts, *ends;
    Py_ssize_t max_tokens, max_chars;
    if (!PyArg_ParseTuple(args, "OOOnn", &data, &starts, &ends, &max_tokens, &max_chars)) return NULL;
    if (encode_refused(self, max_tokens, max_chars)) return NULL;
    Spans sp;
    if (spans_get(data, starts, ends, &sp) < 0) return NULL;
    const Py_ssize_t n = sp.n;
    int32_t *ids = PyMem_Malloc((size_t)(n ? n : 1) * (size_t)max_tokens * sizeof(int32_t));
    int32_t *lengths = PyMem_Calloc((size_t)(n ? n : 1), sizeof(int32_t));
    char *take = PyMem_Calloc((size_t)(n ? n : 1), 1);
    PyObject *others = NULL, *result = NULL;
    Py_ssize_t total = 0, cut = 0, n_others = 0;
    if (ids == NULL || lengths == NULL || take == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const char *base = sp.data.buf;
    const int64_t *a = sp.starts.buf, *b = sp.ends.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *t = (const unsigned char *)base + a[i];
        const Py_ssize_t len = (Py_ssize_t)(b[i] - a[i]);
        int ascii = 1;
        for (Py_ssize_t c = 0; c < len && ascii; c++) ascii = t[c] < 0x80;
        take[i] = (char)(ascii && memchr(t, '[', (size_t)(len > max_chars ? max_chars : len)) == NULL);
        if (!take[i]) {
            n_others++;
            continue;
        }
        int was_cut = 0;
        Py_ssize_t count = encode_one(self, (const char *)t, len > max_chars ? max_chars : len, max_tokens,
                                      ids + total, &was_cut);
        lengths[i] = (int32_t)count;
        total += count;
        cut += was_cut || len > max_chars;
    }
    Py_END_ALLOW_THREADS
    others = PyList_New(n_others);
    if (others == NULL) goto done;
    for (Py_ssize_t i = 0, o = 0; i < n; i++) {
        if (take[i]) continue;
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL) goto done;
        PyList_SET_ITEM(others, o++, index);
    }
    result = Py_BuildValue("(y#y#On)", (const char *)ids, total * (Py_ssize_t)sizeof(int32_t), (const char *)lengths,
                           n * (Py_ssize_t)sizeof(int32_t), others, cut);
done:
    spans_release(&sp);
    PyMem_Free(ids);
    PyMem_Free(lengths);
    PyMem_Free(take);
    Py_XDECREF(others);
    return result;
}

static inline int ascii_space(unsigned char c) { /* str.isspace() of an ASCII character */
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= 0x1F);
}

/* unsure_blank(data, starts, ends) -> bytes of int64: the spans with no ASCII character but whitespace (the
 * empty ones, those of ASCII whitespace only, and those whose other bytes are all beyond ASCII, which only
 * decoding and str.strip() can tell); every other span is surely not blank. Without the GIL. */
static PyObject *unsure_blank(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *data, *starts, *ends;
    if (!PyArg_ParseTuple(args, "OOO", &data, &starts, &ends)) return NULL;
    Spans sp;
    if (spans_get(data, starts, ends, &sp) < 0) return NULL;
    int64_t *rows = PyMem_Malloc((size_t)(sp.n ? sp.n : 1) * sizeof(int64_t));
    if (rows == NULL) {
        spans_release(&sp);
        return PyErr_NoMemory();
    }
    Py_ssize_t found = 0;
    const unsigned char *base = sp.data.buf;
    const int64_t *a = sp.starts.buf, *b = sp.ends.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < sp.n; i++) {
        int word = 0;
        for (int64_t c = a[i]; c < b[i] && !word; c++) word = base[c] < 0x80 && !ascii_space(base[c]);
        if (!word) rows[found++] = i;
    }
    Py_END_ALLOW_THREADS
    PyObject *result = PyBytes_FromStringAndSize((const char *)rows, found * (Py_ssize_t)sizeof(int64_t));
    PyMem_Free(rows);
    spans_release(&sp);
    return result;
}

/* plan_groups(values, ends, per_pass, overhead, padded_rows) -> bytes of int64, G + 1 of them.
 *
 * `stream.models.passes.plan_passes`' dynamic programme over G groups of equal (planned) length, lengths
 * ascending: values[g] a group's length, ends[g + 1] the rows before the end of group g (ends[0] = 0),
 * per_pass[g] the most rows a pass of that length holds. choice[j + 1] is where the cheapest split of groups
 * 0..j starts its last bucket: the first i minimising best[i] + padded(rows) * values[j] + passes(rows) * overhead,
 * rows = ends[j + 1] - ends[i], padded(rows) = rows or, with a table of padded row counts (a fixed shape set),
 * (rows / per) * per + padded_rows[rows % per]. In doubles, as the numpy version it replaces computes. */
static PyObject *plan_groups(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *values_obj, *ends_obj, *per_obj, *table_obj;
    long long overhead;
    if (!PyArg_ParseTuple(args, "OOOLO", &values_obj, &ends_obj, &per_obj, &overhead, &table_obj)) return NULL;
    Py_buffer v = {0}, e = {0}, p = {0}, t = {0};
    int have_table = table_obj != Py_None;
    PyObject *result = NULL;
    if (int64_buf(values_obj, &v, 0, "values") < 0) return NULL;
    const Py_ssize_t groups = v.len / 8;
    if (int64_buf(ends_obj, &e, groups + 1, "ends") < 0) goto fail_v;
    if (int64_buf(per_obj, &p, groups, "per_pass") < 0) goto fail_e;
    if (have_table && int64_buf(table_obj, &t, 1, "padded_rows") < 0) goto fail_p;
    {
        const int64_t *values = v.buf, *ends = e.buf, *per_pass = p.buf, *table = have_table ? t.buf : NULL;
        const Py_ssize_t table_len = have_table ? t.len / 8 : 0;
        for (Py_ssize_t g = 0; g < groups; g++) {
            if (per_pass[g] < 1 || (have_table && per_pass[g] > table_len)) {
                PyErr_Format(PyExc_ValueError, "per_pass[%zd] = %lld: at least 1%s", g, (long long)per_pass[g],
                             have_table ? " and within padded_rows" : "");
                goto fail_t;
            }
        }
        double *best = PyMem_Malloc((size_t)(groups + 1) * sizeof(double));
        result = PyBytes_FromStringAndSize(NULL, (groups + 1) * 8);
        if (best == NULL || result == NULL) {
            PyMem_Free(best);
            Py_XDECREF(result);
            result = NULL;
            if (!PyErr_Occurred()) PyErr_NoMemory();
            goto fail_t;
        }
        int64_t *choice = (int64_t *)PyBytes_AS_STRING(result);
        best[0] = 0.0;
        choice[0] = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = 0; j < groups; j++) {
            const int64_t length = values[j], per = per_pass[j], end = ends[j + 1];
            double low = 0.0;
            int64_t at = 0;
            for (Py_ssize_t i = 0; i <= j; i++) {
                const int64_t rows = end - ends[i];
                const int64_t padded = table ? (rows / per) * per + table[rows % per] : rows;
                double cost = best[i] + (double)(padded * length);
                cost += (double)(((rows + per - 1) / per) * overhead);
                if (i == 0 || cost < low) {
                    low = cost;
                    at = i;
                }
            }
            best[j + 1] = low;
            choice[j + 1] = at;
        }
        Py_END_ALLOW_THREADS
        PyMem_Free(best);
    }
fail_t:
    if (have_table) PyBuffer_Release(&t);
fail_p:
    PyBuffer_Release(&p);
fail_e:
    PyBuffer_Release(&e);
fail_v:
    PyBuffer_Release(&v);
    return result;
}

static PyMethodDef module_methods[] = {
    {"plan_groups", plan_groups, METH_VARARGS,
     "plan_groups(values, ends, per_pass, overhead, padded_rows) -> bytes: see stream/models/_textprep.c"},
    {"unsure_blank", unsure_blank, METH_VARARGS,
     "unsure_blank(data, starts, ends) -> bytes of int64: see stream/models/_textprep.c"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef wp_methods[] = {
    {"encode", (PyCFunction)wp_encode, METH_VARARGS,
     "encode(texts, max_tokens, max_chars) -> (ids, lengths, others, cut): see stream/models/_textprep.c"},
    {"encode_spans", (PyCFunction)wp_encode_spans, METH_VARARGS,
     "encode_spans(data, starts, ends, max_tokens, max_chars) -> encode's result: see stream/models/_textprep.c"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WordPieceType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stream.models._textprep.WordPiece",
    .tp_basicsize = sizeof(WordPiece),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "WordPiece(vocab, unk_id, cls_id, sep_id, max_word_chars, prefix='##'): BERT tokenizing of ASCII texts",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)wp_init,
    .tp_dealloc = (destructor)wp_dealloc,
    .tp_methods = wp_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_textprep",
                                    "the text model's host path in C: WordPiece tokenizing, pass planning (see _textprep.c)", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__textprep(void) {
    if (PyType_Ready(&WordPieceType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&WordPieceType);
    if (PyModule_AddObject(m, "WordPiece", (PyObject *)&WordPieceType) < 0) {
        Py_DECREF(&WordPieceType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
