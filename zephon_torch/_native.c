/* zephon_torch._native: the loops that numpy or the interpreter run slowest here, compiled.
 *
 * fill(parts, out, top): a batch's token ids copied into its int64 buffer, checked on the way.
 * Copies `parts` end to end into `out` (a C-contiguous int64 buffer exactly as long as all of
 * them): each a 1-D integer array, or a span (base, first, stop), ids first..stop-1 of a 1-D
 * integer array (a document of a token chunk, no view made of it). Each id is converted as
 * numpy's int64 cast converts it (signed types sign-extended, unsigned ones zero-extended,
 * unsigned 64-bit ones wrapped); returns True when any converted id, read as unsigned 64-bit,
 * exceeds `top`. One pass over the stored ids instead of numpy's concatenate and then a second
 * pass over the batch to check it (see zephon_torch/ops/_copy.py, which falls back to that). A
 * part whose buffer format is not a native-order integer raises TypeError (the caller then
 * copies with numpy); a part that is not 1-D, a span outside its base, or lengths that do not
 * add up to `out`'s, raise ValueError.
 *
 * walk(values, params): the shuffle's keyed permutation (zephon_torch/work/_permutation.py,
 * whose numpy version it mirrors operation for operation): each value encrypted by the Feistel
 * network its column of `params` describes, again until it lies below that column's range,
 * in place. numpy pays a dozen calls a round for every round of the longest walk.
 *
 * take(chunk, first, stop, room, source, parts, owners, sizes, starts): the block path's
 * search for the documents of a token chunk that fill a micro-batch (see below), the steps of
 * its Python version without the interpreter's cost (0.3-0.8 us of a pre-tokenized batch's
 * 19 at [8, 2048]).
 *
 * places(data, offsets, layout, shifts, firsts, stops): where the token array of every sample
 * of an MDS shard lies, with every check of its numpy version (zephon_torch/io/_mds_bulk.py)
 * in one pass: 10 ns a sample against numpy's 105.
 *
 * fill holds the GIL (a batch's copy takes microseconds); walk lets it go over more than
 * WALK_ALONE values (the elastic sampler's whole dataset: about a second for 20 million), not
 * below, where taking it back could wait on a busy thread for longer than the walk took.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* x86-64 with GCC: the copy loops are built for AVX-512, AVX2 and the baseline, the best the
 * CPU has chosen when the module loads (glibc's ifunc); elsewhere (musl has no ifunc), the
 * compiler's default. */
#if defined(__x86_64__) && defined(__GLIBC__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* One loop per stored type: `n` ids from `src`, `stride` bytes apart, into `dst`; returns
 * whether any exceeds `top` as unsigned. Contiguous parts take a loop the compiler
 * vectorizes. Ids are read with memcpy: a part need not be aligned to its type (an MDS
 * sample's array lies wherever the sample's bytes put it). */
#define COPY_LOOP(NAME, T)                                                                  \
    CLONES static int NAME(const char *src, Py_ssize_t stride, Py_ssize_t n, int64_t *dst, \
                           uint64_t top) {                                                  \
        int over = 0;                                                                       \
        if (stride == (Py_ssize_t)sizeof(T)) {                                              \
            for (Py_ssize_t i = 0; i < n; i++) {                                            \
                T value;                                                                    \
                memcpy(&value, src + i * (Py_ssize_t)sizeof(T), sizeof(T));                 \
                int64_t v = (int64_t)value;                                                 \
                dst[i] = v;                                                                 \
                over |= (uint64_t)v > top;                                                  \
            }                                                                               \
        } else {                                                                            \
            for (Py_ssize_t i = 0; i < n; i++) {                                            \
                T value;                                                                    \
                memcpy(&value, src + i * stride, sizeof(T));                                \
                int64_t v = (int64_t)value;                                                 \
                dst[i] = v;                                                                 \
                over |= (uint64_t)v > top;                                                  \
            }                                                                               \
        }                                                                                   \
        return over;                                                                        \
    }

COPY_LOOP(copy_i8, int8_t)
COPY_LOOP(copy_u8, uint8_t)
COPY_LOOP(copy_i16, int16_t)
COPY_LOOP(copy_u16, uint16_t)
COPY_LOOP(copy_i32, int32_t)
COPY_LOOP(copy_u32, uint32_t)
COPY_LOOP(copy_i64, int64_t)
COPY_LOOP(copy_u64, uint64_t)

typedef int (*copy_fn)(const char *, Py_ssize_t, Py_ssize_t, int64_t *, uint64_t);

/* The loop for a buffer's struct format and item size; NULL for anything but a native-order
 * integer. */
static copy_fn loop_for(const char *format, Py_ssize_t itemsize) {
    char order = format[0];
    if (order == '@' || order == '=' || order == '<' || order == '>' || order == '!') {
#if PY_BIG_ENDIAN
        if (order == '<') return NULL;
#else
        if (order == '>' || order == '!') return NULL;
#endif
        format++;
    }
    if (format[0] == '\0' || format[1] != '\0') return NULL;
    int is_signed;
    switch (format[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n':
        is_signed = 1;
        break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N':
        is_signed = 0;
        break;
    default:
        return NULL;
    }
    switch (itemsize) {
    case 1: return is_signed ? copy_i8 : copy_u8;
    case 2: return is_signed ? copy_i16 : copy_u16;
    case 4: return is_signed ? copy_i32 : copy_u32;
    case 8: return is_signed ? copy_i64 : copy_u64;
    default: return NULL;
    }
}

/* The buffers of the bases that a call's spans name, each asked for once: a chunk's spans
 * share a handful of bases (one a byte shift of a shard), and asking numpy for an array's
 * buffer costs about as much as the copy of a short document. Each is held with a reference
 * to its base, so no other object takes the base's address while it is kept. */
#define HELD_BASES 8
typedef struct {
    PyObject *base[HELD_BASES]; /* NULL: the slot holds no buffer */
    Py_buffer view[HELD_BASES];
    int count, next;
} Bases;

static void release_bases(Bases *held) {
    for (int i = 0; i < held->count; i++) {
        if (held->base[i] != NULL) {
            PyBuffer_Release(&held->view[i]);
            Py_CLEAR(held->base[i]);
        }
    }
    held->count = 0;
}

/* `base`'s buffer, asked for where it is not held (the oldest one given up past HELD_BASES). */
static Py_buffer *base_buffer(Bases *held, PyObject *base) {
    for (int i = 0; i < held->count; i++)
        if (held->base[i] == base) return &held->view[i];
    int slot;
    if (held->count < HELD_BASES) {
        slot = held->count++;
    } else {
        slot = held->next;
        held->next = (slot + 1) % HELD_BASES;
        PyBuffer_Release(&held->view[slot]);
        Py_CLEAR(held->base[slot]);
    }
    held->base[slot] = NULL;
    if (PyObject_GetBuffer(base, &held->view[slot], PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        return NULL;
    held->base[slot] = Py_NewRef(base);
    return &held->view[slot];
}

static PyObject *fill(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *parts, *target;
    Py_buffer out;
    PyObject *top_obj;
    if (!PyArg_ParseTuple(args, "OOO!:fill", &parts, &target, &PyLong_Type, &top_obj))
        return NULL;
    unsigned long long top = PyLong_AsUnsignedLongLong(top_obj);  /* refuses < 0 and >= 2**64 */
    if (top == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (PyObject_GetBuffer(target, &out, PyBUF_STRIDES | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return NULL;
    PyObject *seq = NULL;
    Bases held = {.count = 0, .next = 0};
    if (out.itemsize != 8 || out.len % 8 != 0 || !PyBuffer_IsContiguous(&out, 'C') ||
        loop_for(out.format ? out.format : "B", out.itemsize) != copy_i64) {
        PyErr_SetString(PyExc_ValueError, "fill: `out` must be a contiguous int64 buffer");
        goto fail;
    }
    seq = PySequence_Fast(parts, "fill: `parts` must be a sequence");
    if (seq == NULL) goto fail;
    int64_t *dst = (int64_t *)out.buf;
    Py_ssize_t room = out.len / 8;
    int over = 0;
    /* A list's items are read one at a time, each held while its buffer is taken: a part's
     * __buffer__ (Python 3.12) may run code that changes the list. */
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        Py_buffer own, *part = &own;
        Py_ssize_t first = 0, stop = -1;
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(seq, k));
        if (PyTuple_CheckExact(item)) { /* a span (base, first, stop): the tuple holds them */
            if (PyTuple_GET_SIZE(item) != 3) {
                Py_DECREF(item);
                PyErr_Format(PyExc_ValueError, "fill: part %zd is not (base, first, stop)", k);
                goto fail;
            }
            /* each converted whatever the other holds: (base, -1, "x") is a TypeError */
            if (((first = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1))) == -1 && PyErr_Occurred()) ||
                ((stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2))) == -1 && PyErr_Occurred())) {
                Py_DECREF(item);
                goto fail;
            }
            part = base_buffer(&held, PyTuple_GET_ITEM(item, 0));
            Py_DECREF(item); /* a held buffer holds its base */
            if (part == NULL) goto fail;
        } else {
            int taken = PyObject_GetBuffer(item, &own, PyBUF_STRIDES | PyBUF_FORMAT);
            Py_DECREF(item); /* a buffer holds its own reference */
            if (taken < 0) goto fail;
        }
        copy_fn loop = loop_for(part->format ? part->format : "B", part->itemsize);
        const char *problem = NULL;
        PyObject *kind = PyExc_ValueError;
        if (loop == NULL) {
            problem = "does not hold native integers";
            kind = PyExc_TypeError;
        } else if (part->ndim != 1) {
            problem = "is not 1-D";
        } else if (part == &own) {
            stop = part->shape[0];
        } else if (first < 0 || stop < first || stop > part->shape[0]) {
            problem = "is a span outside its base";
        }
        /* taken only of a span within its base: a refused one's ends may be any two ints,
         * whose difference need not fit */
        Py_ssize_t n = problem == NULL ? stop - first : 0;
        if (problem != NULL || n > room) {
            if (part == &own) PyBuffer_Release(&own);
            if (problem != NULL) PyErr_Format(kind, "fill: part %zd %s", k, problem);
            else PyErr_SetString(PyExc_ValueError, "fill: the parts are longer than `out`");
            goto fail;
        }
        if (n > 0) /* an empty span's address is not formed: past a reversed base's start */
            over |= loop((const char *)part->buf + first * part->strides[0], part->strides[0], n,
                         dst, (uint64_t)top);
        if (part == &own) PyBuffer_Release(&own);
        dst += n;
        room -= n;
    }
    if (room != 0) {
        PyErr_SetString(PyExc_ValueError, "fill: the parts are shorter than `out`");
        goto fail;
    }
    release_bases(&held);
    Py_DECREF(seq);
    PyBuffer_Release(&out);
    return PyBool_FromLong(over);
fail:
    release_bases(&held);
    Py_XDECREF(seq);
    PyBuffer_Release(&out);
    return NULL;
}

/* SplitMix64's finaliser (zephon_torch/work/_hashing.py's mix64_inplace). */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

/* One pass of the Feistel network: `p` points at a column's rows (n, shift, mask, round keys
 * ...), `step` entries apart. */
static inline uint64_t encrypt(uint64_t x, const uint64_t *p, Py_ssize_t step, Py_ssize_t rounds) {
    uint64_t shift = p[step], mask = p[2 * step];
    uint64_t left = x >> shift, right = x & mask;
    for (Py_ssize_t r = 0; r < rounds; r++) {
        uint64_t scrambled = ((mix64(right ^ p[(3 + r) * step]) & mask) ^ left);
        left = right;
        right = scrambled;
    }
    return (left << shift) | right;
}

#define WALK_ALONE 65536

static PyObject *walk(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *values_obj, *params_obj;
    if (!PyArg_ParseTuple(args, "OO:walk", &values_obj, &params_obj)) return NULL;
    Py_buffer values, params;
    if (PyObject_GetBuffer(values_obj, &values, PyBUF_ND | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(params_obj, &params, PyBUF_ND | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&values);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t count = values.ndim == 1 ? values.shape[0] : -1;
    Py_ssize_t rows = params.ndim == 2 ? params.shape[0] : 0;
    Py_ssize_t columns = params.ndim == 2 ? params.shape[1] : 0;
    if (count < 0 || loop_for(values.format, values.itemsize) != copy_u64) {
        PyErr_SetString(PyExc_ValueError, "walk: `values` must be a contiguous 1-D uint64 array");
    } else if (rows < 3 || loop_for(params.format, params.itemsize) != copy_u64 ||
               (columns != 1 && columns != count)) {
        PyErr_SetString(PyExc_ValueError,
                        "walk: `params` must be a contiguous uint64 array of 3 rows and the round "
                        "keys, one column or one per value");
    } else {
        uint64_t *x = (uint64_t *)values.buf;
        const uint64_t *p = (const uint64_t *)params.buf;
        Py_ssize_t rounds = rows - 3, step = columns;
        Py_ssize_t i = 0;
        PyThreadState *released = count > WALK_ALONE ? PyEval_SaveThread() : NULL;
        for (; i < count; i++) {
            const uint64_t *column = columns == 1 ? p : p + i;
            uint64_t n = column[0], shift = column[step], mask = column[2 * step];
            /* a value outside the domain, or a domain the shift and mask do not cover, would
             * never walk back below n */
            if (x[i] >= n || shift == 0 || shift > 32 || mask != (1ULL << shift) - 1 ||
                (shift < 32 && n > (1ULL << (2 * shift))))
                break;
            uint64_t y = x[i];
            do {
                y = encrypt(y, column, step, rounds);
            } while (y >= n);
            x[i] = y;
        }
        if (released != NULL) PyEval_RestoreThread(released);
        if (i < count)
            PyErr_Format(PyExc_ValueError, "walk: value %zd lies outside its permutation's range", i);
        else
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&params);
    PyBuffer_Release(&values);
    return result;
}

/* take(chunk, first, stop, room, source, parts, owners, sizes, starts): the block path's
 * search in a TokenChunk (zephon_torch/ops/_wrap_blocks.py, WrapBlocks._take, whose Python
 * version it mirrors step for step). Of `chunk`'s documents first..stop-1, the whole ones
 * that fit in `room` tokens (found by bisect_right in `chunk.ends`), then, where room is left
 * and a document remains, that document's first tokens to fill it: each appended as its span
 * (base, first, stop) of the chunk's arrays (no view made: `fill` copies spans), its owner
 * (source, shard, row), its size and True (it begins its document). Returns (tokens taken,
 * the index after the last document taken, the cut document's tokens taken, 0 where none was
 * cut). */
enum { C_ENDS, C_BASES, C_FIRSTS, C_STOPS, C_SIZES, C_SHARDS, C_ROWS, COLUMNS };
static PyObject *COLUMN_NAMES[COLUMNS];

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL) return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* Whether document `k` lies within each of the columns `take` reads per document. */
static int holds(PyObject *const *columns, Py_ssize_t k) {
    for (int c = C_BASES; c < COLUMNS; c++)
        if (k >= PyList_GET_SIZE(columns[c])) return 0;
    return 1;
}

/* (a, b, c), the three held while the tuple is made (its allocation may run the collector,
 * and a finalizer that empties the lists they came from would free them). */
static PyObject *triple(PyObject *a, PyObject *b, PyObject *c) {
    Py_INCREF(a);
    Py_INCREF(b);
    Py_INCREF(c);
    PyObject *made = PyTuple_Pack(3, a, b, c);
    Py_DECREF(a);
    Py_DECREF(b);
    Py_DECREF(c);
    return made;
}

#define AT(c, k) PyList_GET_ITEM(columns[c], k)

static PyObject *take(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "take: expected 9 arguments");
        return NULL;
    }
    PyObject *chunk = args[0], *source = args[4];
    PyObject *parts = args[5], *owners = args[6], *sizes_out = args[7], *starts = args[8];
    Py_ssize_t first, stop, room; /* each converted only where the one before it was */
    if ((first = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred()) return NULL;
    if ((stop = PyLong_AsSsize_t(args[2])) == -1 && PyErr_Occurred()) return NULL;
    if ((room = PyLong_AsSsize_t(args[3])) == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_CheckExact(parts) || !PyList_CheckExact(owners) ||
        !PyList_CheckExact(sizes_out) || !PyList_CheckExact(starts)) {
        PyErr_SetString(PyExc_TypeError, "take: the four outputs must be lists");
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *columns[COLUMNS] = {NULL};
    /* each read only where the one before it was: an attribute's code (a property) must not
     * run with an exception set, which it could lose */
    for (int c = 0; c < COLUMNS; c++) {
        if ((columns[c] = PyObject_GetAttr(chunk, COLUMN_NAMES[c])) == NULL) goto done;
        if (!PyList_CheckExact(columns[c])) {
            PyErr_SetString(PyExc_TypeError, "take: the chunk's columns must be lists");
            goto done;
        }
    }
    Py_ssize_t count = PyList_GET_SIZE(columns[C_BASES]);
    int even = PyList_GET_SIZE(columns[C_ENDS]) == count + 1;
    for (int c = C_BASES; c < COLUMNS; c++) even = even && PyList_GET_SIZE(columns[c]) == count;
    if (first < 0 || stop < first || stop > count || room <= 0 || !even) {
        PyErr_SetString(PyExc_ValueError, "take: documents or columns out of range");
        goto done;
    }
    Py_ssize_t base = PyLong_AsSsize_t(AT(C_ENDS, first));
    if (base == -1 && PyErr_Occurred()) goto done;
    /* bisect_right(ends, base + room, first, stop + 1) - 1 */
    /* base + room (room > 0), held at PY_SSIZE_T_MAX where it would pass it: no sum lies
     * above that, so the search finds the same (and Python's unbounded sum is mirrored) */
    Py_ssize_t bound = base > 0 && room > PY_SSIZE_T_MAX - base ? PY_SSIZE_T_MAX : base + room;
    Py_ssize_t lo = first, hi = stop + 1;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        Py_ssize_t end = PyLong_AsSsize_t(AT(C_ENDS, mid));
        if (end == -1 && PyErr_Occurred()) goto done;
        if (bound < end) hi = mid;
        else lo = mid + 1;
    }
    Py_ssize_t last = lo - 1; /* at least `first` where the sums ascend */
    Py_ssize_t reached = last < first ? -1 : PyLong_AsSsize_t(AT(C_ENDS, last));
    if (reached == -1 && PyErr_Occurred()) goto done;
    if (last < first || reached < base) { /* compared, not subtracted: no difference wraps */
        PyErr_SetString(PyExc_ValueError, "take: the chunk's running sums do not ascend");
        goto done;
    }
    Py_ssize_t taken = reached - base; /* at most room: reached <= bound */
    /* Code may run below and change the columns: (Python 3.11, which collects on allocation)
     * a finalizer run by the collector when a tuple or an int is made. So each document's
     * place in the columns is checked before it is read, and what is read is held while its
     * tuple is made. */
    for (Py_ssize_t k = first; k < last; k++) {
        if (!holds(columns, k)) goto changed;
        if (append_new(parts, triple(AT(C_BASES, k), AT(C_FIRSTS, k), AT(C_STOPS, k))) < 0)
            goto done;
        if (!holds(columns, k)) goto changed;
        if (PyList_Append(sizes_out, AT(C_SIZES, k)) < 0 || PyList_Append(starts, Py_True) < 0 ||
            append_new(owners, triple(source, AT(C_SHARDS, k), AT(C_ROWS, k))) < 0)
            goto done;
    }
    Py_ssize_t cut = 0;
    if (taken < room && last < stop) { /* the next document fills the room, its rest carried */
        if (!holds(columns, last)) goto changed;
        cut = room - taken;
        PyObject *from = Py_NewRef(AT(C_BASES, last)), *begin = Py_NewRef(AT(C_FIRSTS, last));
        Py_ssize_t at = PyLong_AsSsize_t(begin);
        PyObject *end = NULL, *span = NULL;
        if (!(at == -1 && PyErr_Occurred())) {
            if (at < 0 || cut > PY_SSIZE_T_MAX - at)
                PyErr_SetString(PyExc_ValueError, "take: a span's first id is out of range");
            else if ((end = PyLong_FromSsize_t(at + cut)) != NULL)
                span = PyTuple_Pack(3, from, begin, end);
        }
        Py_DECREF(from);
        Py_DECREF(begin);
        Py_XDECREF(end);
        if (append_new(parts, span) < 0) goto done;
        if (!holds(columns, last)) goto changed; /* the allocations ran a finalizer */
        if (append_new(sizes_out, PyLong_FromSsize_t(cut)) < 0 ||
            PyList_Append(starts, Py_True) < 0)
            goto done;
        if (!holds(columns, last)) goto changed;
        if (append_new(owners, triple(source, AT(C_SHARDS, last), AT(C_ROWS, last))) < 0)
            goto done;
        taken = room;
        last += 1;
    }
    result = Py_BuildValue("(nnn)", taken, last, cut);
    goto done;
changed:
    PyErr_SetString(PyExc_RuntimeError, "take: the chunk's columns changed during the call");
done:
    for (int c = 0; c < COLUMNS; c++) Py_XDECREF(columns[c]);
    return result;
}

#undef AT

/* places(data, offsets, layout, shifts, firsts, stops): where the one array column of every
 * sample of an MDS shard lies (zephon_torch/io/_mds_bulk.py: `array_bounds` then `places`,
 * whose numpy version it mirrors check for check), written into `shifts` (uint8), `firsts`
 * and `stops` (uint32), one per sample. `data`: the shard's bytes; `offsets`: its samples'
 * int64 starts and end (ascending, within `data`); `layout`: (variable, fixed, before_fixed,
 * earlier, length_at, size, count, itemsize), -1 for a None. Returns False, having stopped,
 * at the first sample that is not as the encoding says (the per-sample decoder then names
 * it). One pass of a few loads a sample where numpy makes 60 passes over the shard. */
static void little_u64(const unsigned char *at, int width, uint64_t *out) {
    uint64_t value = 0;
    for (int b = width - 1; b >= 0; b--) value = (value << 8) | at[b];
    *out = value;
}

static PyObject *places(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *data_obj, *offsets_obj, *shifts_obj, *firsts_obj, *stops_obj;
    Py_ssize_t variable, fixed, before_fixed, earlier, length_at, size, count, itemsize;
    if (!PyArg_ParseTuple(args, "OO(nnnnnnnn)OOO:places", &data_obj, &offsets_obj, &variable,
                          &fixed, &before_fixed, &earlier, &length_at, &size, &count, &itemsize,
                          &shifts_obj, &firsts_obj, &stops_obj))
        return NULL;
    Py_buffer data, offsets, shifts, firsts, stops;
    int held = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) return NULL;
    held = 1;
    if (PyObject_GetBuffer(offsets_obj, &offsets, PyBUF_ND | PyBUF_FORMAT) < 0) goto done;
    held = 2;
    if (PyObject_GetBuffer(shifts_obj, &shifts, PyBUF_ND | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        goto done;
    held = 3;
    if (PyObject_GetBuffer(firsts_obj, &firsts, PyBUF_ND | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        goto done;
    held = 4;
    if (PyObject_GetBuffer(stops_obj, &stops, PyBUF_ND | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
        goto done;
    held = 5;
    Py_ssize_t n = offsets.ndim == 1 ? offsets.shape[0] - 1 : -1;
    if (n < 0 || loop_for(offsets.format, offsets.itemsize) != copy_i64 ||
        shifts.ndim != 1 || shifts.shape[0] != n || loop_for(shifts.format, 1) != copy_u8 ||
        firsts.ndim != 1 || firsts.shape[0] != n || loop_for(firsts.format, 4) != copy_u32 ||
        stops.ndim != 1 || stops.shape[0] != n || loop_for(stops.format, 4) != copy_u32 ||
        shifts.itemsize != 1 || firsts.itemsize != 4 || stops.itemsize != 4) {
        PyErr_SetString(PyExc_ValueError,
                        "places: `offsets` must be 1-D int64, and `shifts`, `firsts` and "
                        "`stops` 1-D uint8, uint32 and uint32 arrays of one less");
        goto done;
    }
    /* any number of variable columns (MDS sets none), below 2**32: the sum of their 32-bit
     * lengths then fits in 64 bits */
    if (variable < 0 || variable > 0xFFFFFFFFLL || fixed < 0 || before_fixed < 0 || earlier < 0 ||
        earlier > variable || length_at >= variable || (length_at < 0 && size < 0) ||
        (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "places: an impossible layout");
        goto done;
    }
    const unsigned char *raw = (const unsigned char *)data.buf;
    const int64_t *at = (const int64_t *)offsets.buf;
    uint8_t *shift_out = (uint8_t *)shifts.buf;
    uint32_t *first_out = (uint32_t *)firsts.buf, *stop_out = (uint32_t *)stops.buf;
    int64_t length = data.len;
    Py_ssize_t i = 0;
    for (; i < n; i++) {
        int64_t start = at[i], end = at[i + 1];
        if (start < 0 || end < start || end > length || end - start < 4 * (int64_t)variable)
            break; /* end - start: from 0 to length, no wrap */
        /* the lengths: all of them, those of the variable columns before the array, its own */
        uint64_t total = 0, prefix = 0, own = 0;
        for (Py_ssize_t j = 0; j < variable; j++) {
            uint64_t value;
            little_u64(raw + start + 4 * j, 4, &value);
            total += value;
            if (j < earlier) prefix += value;
            if (j == length_at) own = value;
        }
        int64_t column = start + 4 * (int64_t)variable;
        /* fixed + total == end - column (>= 0), compared without a sum that could wrap */
        uint64_t left = (uint64_t)(end - column);
        if (total > left || left - total != (uint64_t)fixed) break;
        /* numpy: column_end > end. Each step checked against the bytes left, not added first:
         * a layout's sizes (before_fixed, size) may be anything up to 2**63 - 1, and a sum
         * past that would wrap below `end` (and `column` below the buffer) */
        uint64_t skip = (uint64_t)before_fixed + prefix; /* prefix <= total <= left < 2**63 */
        if (skip > left) break;
        column += (int64_t)skip;
        uint64_t span = length_at < 0 ? (uint64_t)size : own;
        if (span > (uint64_t)(end - column)) break; /* and so no byte is read past the sample */
        int64_t column_end = column + (int64_t)span;
        int64_t begin;
        uint64_t values;
        if (count < 0) { /* a shape header: one byte, then one dimension of 1, 2, 4 or 8 */
            if (column >= column_end || raw[column] >> 2 != 1) break;
            int width = 1 << (raw[column] & 3);
            begin = column + 1 + width;
            if (begin > column_end) break; /* numpy: room < 0 */
            little_u64(raw + column + 1, width, &values); /* above 2**63: refused below */
        } else {
            begin = column;
            values = (uint64_t)count;
        }
        uint64_t room = (uint64_t)(column_end - begin);
        if (values > room || values * (uint64_t)itemsize != room) break;
        shift_out[i] = (uint8_t)(begin % itemsize);
        first_out[i] = (uint32_t)(begin / itemsize);
        stop_out[i] = (uint32_t)(begin / itemsize + (int64_t)values);
    }
    result = PyBool_FromLong(i == n);
done:
    if (held >= 5) PyBuffer_Release(&stops);
    if (held >= 4) PyBuffer_Release(&firsts);
    if (held >= 3) PyBuffer_Release(&shifts);
    if (held >= 2) PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS,
     "fill(parts, out, top) -> bool: copy `parts` (1-D integer arrays, or spans (base, first, "
     "stop) of them) end to end into the contiguous int64 buffer `out`; True when an id, read "
     "as unsigned 64-bit, exceeds `top`."},
    {"walk", walk, METH_VARARGS,
     "walk(values, params): each uint64 value through the keyed permutation its column of "
     "`params` (n, shift, mask, round keys) describes, in place."},
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL,
     "take(chunk, first, stop, room, source, parts, owners, sizes, starts) -> (taken, last, "
     "cut): the documents of a TokenChunk that fill `room` tokens, appended to the lists (as "
     "spans)."},
    {"places", places, METH_VARARGS,
     "places(data, offsets, layout, shifts, firsts, stops) -> bool: where each MDS sample's "
     "one array column lies, written into the three arrays; False at a sample not as "
     "encoded."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "zephon_torch._native",
    "Compiled loops: a batch's checked copy (fill), the shuffle's permutation (walk), the "
    "block path's search in a token chunk (take) and an MDS shard's array places (places).", -1,
    methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    static const char *names[COLUMNS] = {"ends",  "bases",  "firsts", "stops",
                                         "sizes", "shards", "rows"};
    for (int c = 0; c < COLUMNS; c++)
        if ((COLUMN_NAMES[c] = PyUnicode_InternFromString(names[c])) == NULL) return NULL;
    return PyModule_Create(&module);
}
