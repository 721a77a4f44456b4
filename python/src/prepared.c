/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte.XferList (te_xfer_list_prepare) and the body of
 * Batch.submit_prepared (te_submit_prepared). Addresses, lengths and
 * indices come as any buffer of 8-byte integers (NumPy arrays,
 * array('Q')), indices also of 4-byte ones, which are passed to libte as
 * they are, or as sequences of ints; no Python object per element for
 * buffers.
 */
#include "pyte.h"

#include <errno.h>
#include <string.h>

typedef struct {
	PyObject_HEAD
	PyteEngine *engine;
	te_xfer_list *l;
	te_segment_id segment;
	size_t n;
	uint64_t lo, hi; /* the pieces' span (local lists: what a post touches) */
} PyteXferList;

/* A 1-D C-contiguous buffer of integers of `size` bytes (4 or 8), or -1
 * with TypeError naming `what`; 0 when `o` has no buffer (and is no str). */
static int int_view(PyObject *o, Py_buffer *v, const char *what, int want4)
{
	if (!PyObject_CheckBuffer(o) || PyUnicode_Check(o) || PyBytes_Check(o))
		return 0;
	if (PyObject_GetBuffer(o, v, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
		return -1;
	const char *fmt = v->format ? v->format : "B";
	if (*fmt == '@' || *fmt == '=' || *fmt == '<')
		fmt++;
	int ok8 = v->itemsize == 8 && strchr("QqLlKk", *fmt) != NULL;
	int ok4 = want4 && v->itemsize == 4 && strchr("IiLl", *fmt) != NULL;
	if (v->ndim != 1 || fmt[0] == '\0' || fmt[1] != '\0' || !(ok8 || ok4)) {
		PyErr_Format(PyExc_TypeError, "%s: an array must hold %s integers, not format '%s' of %zd-byte items",
			     what, want4 ? "4- or 8-byte" : "8-byte", v->format ? v->format : "B", v->itemsize);
		PyBuffer_Release(v);
		return -1;
	}
	return 1;
}

/* `o` as n uint64 values into *out (PyMem_Malloc'd; *n set). An int
 * stands for `fill` copies of itself when fill > 0. */
static int u64_column(PyObject *o, const char *what, Py_ssize_t fill, uint64_t **out, Py_ssize_t *n)
{
	Py_buffer v;
	*out = NULL;
	if (fill > 0 && PyLong_Check(o)) {
		uint64_t x = PyLong_AsUnsignedLongLong(o);
		if (PyErr_Occurred())
			return -1;
		*out = PyMem_Malloc((size_t)fill * 8);
		if (*out == NULL) {
			PyErr_NoMemory();
			return -1;
		}
		for (Py_ssize_t i = 0; i < fill; i++)
			(*out)[i] = x;
		*n = fill;
		return 0;
	}
	int rc = int_view(o, &v, what, 0);
	if (rc < 0)
		return -1;
	if (rc == 1) {
		*n = v.len / 8;
		*out = PyMem_Malloc(v.len > 0 ? (size_t)v.len : 1);
		if (*out == NULL) {
			PyBuffer_Release(&v);
			PyErr_NoMemory();
			return -1;
		}
		memcpy(*out, v.buf, (size_t)v.len);
		PyBuffer_Release(&v);
		return 0;
	}
	char msg[128];
	snprintf(msg, sizeof msg, "%s must be a sequence of ints or an array of 8-byte integers", what);
	PyObject *fast = PySequence_Fast(o, msg);
	if (fast == NULL)
		return -1;
	*n = PySequence_Fast_GET_SIZE(fast);
	*out = PyMem_Malloc(*n > 0 ? (size_t)*n * 8 : 1);
	if (*out == NULL) {
		Py_DECREF(fast);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < *n; i++) {
		(*out)[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(fast, i));
		if (PyErr_Occurred()) {
			Py_DECREF(fast);
			PyMem_Free(*out);
			*out = NULL;
			return -1;
		}
	}
	Py_DECREF(fast);
	return 0;
}

/* Engine.prepare(segment, addrs, lengths) */
PyObject *pyte_engine_prepare(PyteEngine *eo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "segment", "addrs", "lengths", NULL };
	PyObject *addrs_o, *lens_o;
	te_segment_id seg;
	uint64_t *addrs = NULL, *lens = NULL;
	Py_ssize_t n = 0, nl = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&OO:prepare", kwlist, pyte_segment_arg, &seg, &addrs_o, &lens_o) ||
	    u64_column(addrs_o, "addrs", 0, &addrs, &n) < 0)
		return NULL;
	if (u64_column(lens_o, "lengths", n, &lens, &nl) < 0) {
		PyMem_Free(addrs);
		return NULL;
	}
	PyObject *res = NULL;
	te_piece *pc = NULL;
	if (nl != n) {
		PyErr_Format(PyExc_ValueError, "addrs and lengths differ in length (%zd, %zd)", n, nl);
		goto out;
	}
	pc = PyMem_Malloc(n > 0 ? (size_t)n * sizeof *pc : 1);
	if (pc == NULL) {
		PyErr_NoMemory();
		goto out;
	}
	uint64_t lo = UINT64_MAX, hi = 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		pc[i] = (te_piece){ addrs[i], lens[i] };
		if (addrs[i] < lo)
			lo = addrs[i];
		if (addrs[i] + lens[i] > hi)
			hi = addrs[i] + lens[i];
	}
	if (pyte_enter(eo) < 0)
		goto out;
	te_xfer_list *l = NULL;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	rc = te_xfer_list_prepare(eo->e, seg, pc, (size_t)n, 0, &l);
	Py_END_ALLOW_THREADS
	pyte_leave(eo);
	if (rc < 0) {
		pyte_raise_msg(rc, "Engine.prepare(%zd pieces): %s", n, te_strerror(rc));
		goto out;
	}
	PyteXferList *xl = PyObject_New(PyteXferList, &PyteXferListType);
	if (xl == NULL) {
		te_xfer_list_free(l);
		goto out;
	}
	xl->engine = (PyteEngine *)Py_NewRef((PyObject *)eo);
	xl->l = l;
	xl->segment = seg;
	xl->n = (size_t)n;
	xl->lo = lo;
	xl->hi = hi;
	res = (PyObject *)xl;
out:
	PyMem_Free(pc);
	PyMem_Free(addrs);
	PyMem_Free(lens);
	return res;
}

/* Indices: None (0..n-1, *idx NULL), a buffer of 4-byte integers (used
 * in place: *view holds it), or 8-byte integers / a sequence, converted
 * into *owned. *n: their number. */
typedef struct idx_arg {
	const uint32_t *idx;
	uint32_t *owned;
	Py_buffer view;
	int has_view;
	Py_ssize_t n;
} idx_arg;

static void idx_close(idx_arg *a)
{
	if (a->has_view)
		PyBuffer_Release(&a->view);
	PyMem_Free(a->owned);
}

static int idx_open(PyObject *o, const char *what, idx_arg *a)
{
	memset(a, 0, sizeof *a);
	a->n = -1;
	if (o == Py_None)
		return 0;
	int rc = int_view(o, &a->view, what, 1);
	if (rc < 0)
		return -1;
	if (rc == 1 && a->view.itemsize == 4) {
		a->has_view = 1;
		a->idx = a->view.buf;
		a->n = a->view.len / 4;
		return 0;
	}
	if (rc == 1)
		PyBuffer_Release(&a->view);
	uint64_t *v = NULL;
	if (u64_column(o, what, 0, &v, &a->n) < 0)
		return -1;
	a->owned = PyMem_Malloc(a->n > 0 ? (size_t)a->n * 4 : 1);
	if (a->owned == NULL) {
		PyMem_Free(v);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < a->n; i++) {
		if (v[i] > UINT32_MAX) {
			PyErr_Format(PyExc_IndexError, "%s[%zd] = %llu is not an index of a list", what, i,
				     (unsigned long long)v[i]);
			PyMem_Free(v);
			return -1;
		}
		a->owned[i] = (uint32_t)v[i];
	}
	PyMem_Free(v);
	a->idx = a->owned;
	return 0;
}

/* Batch.submit_prepared(op, local, remote, local_idx=None, remote_idx=None,
 * count=None); the batch is entered (pyte_enter) by the caller. */
PyObject *pyte_submit_prepared(PyteEngine *eo, te_batch_id id, pyte_use *use, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "op", "local", "remote", "local_idx", "remote_idx", "count", NULL };
	unsigned op;
	PyObject *lo_o, *ro_o, *li_o = Py_None, *ri_o = Py_None, *count_o = Py_None;
	idx_arg li, ri;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "IO!O!|OOO:submit_prepared", kwlist, &op, &PyteXferListType, &lo_o,
					 &PyteXferListType, &ro_o, &li_o, &ri_o, &count_o))
		return NULL;
	PyteXferList *L = (PyteXferList *)lo_o, *R = (PyteXferList *)ro_o;
	if (L->engine != eo || R->engine != eo) {
		PyErr_SetString(PyExc_ValueError, "submit_prepared: a list of another engine");
		return NULL;
	}
	if (idx_open(li_o, "local_idx", &li) < 0)
		return NULL;
	if (idx_open(ri_o, "remote_idx", &ri) < 0) {
		idx_close(&li);
		return NULL;
	}
	PyObject *res = NULL;
	Py_ssize_t n = li.n >= 0 ? li.n : ri.n;
	if (count_o != Py_None) {
		Py_ssize_t c = PyNumber_AsSsize_t(count_o, PyExc_OverflowError);
		if (c < 0) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_ValueError, "submit_prepared: count < 0");
			goto out;
		}
		if ((li.n >= 0 && li.n != c) || (ri.n >= 0 && ri.n != c)) {
			PyErr_Format(PyExc_ValueError, "submit_prepared: count %zd differs from the indices' %zd", c,
				     li.n >= 0 && li.n != c ? li.n : ri.n);
			goto out;
		}
		n = c;
	} else if (n < 0) {
		PyErr_SetString(PyExc_ValueError, "submit_prepared: without indices, give count");
		goto out;
	} else if (li.n >= 0 && ri.n >= 0 && li.n != ri.n) {
		PyErr_Format(PyExc_ValueError, "local_idx and remote_idx differ in length (%zd, %zd)", li.n, ri.n);
		goto out;
	}
	size_t first = 0, tasks = 0;
	int rc;
	Py_BEGIN_ALLOW_THREADS
	pthread_rwlock_rdlock(&eo->sublock);
	/* the local lists' span: unregistering waits for the batch */
	pyte_use_widen(eo, use, L->lo, L->hi);
	if (R->segment == TE_LOCAL_SEGMENT)
		pyte_use_widen(eo, use, R->lo, R->hi);
	rc = te_submit_prepared(eo->e, id, op, L->l, li.idx, R->l, ri.idx, (size_t)n, &first, &tasks);
	pthread_rwlock_unlock(&eo->sublock);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		pyte_raise_msg(rc, "Batch.submit_prepared(%zd pairs): %s", n, te_strerror(rc));
	else
		res = Py_BuildValue("(nnn)", (Py_ssize_t)first, (Py_ssize_t)tasks, (Py_ssize_t)rc);
out:
	idx_close(&li);
	idx_close(&ri);
	return res;
}

/* ------------------------------------------------------------- the type */

static void xl_dealloc(PyteXferList *xl)
{
	/* Freeing touches no engine: fine after the engine's close too. */
	te_xfer_list_free(xl->l);
	Py_XDECREF(xl->engine);
	PyObject_Free(xl);
}

static Py_ssize_t xl_len(PyteXferList *xl)
{
	return (Py_ssize_t)xl->n;
}

static PyObject *xl_repr(PyteXferList *xl)
{
	return PyUnicode_FromFormat("<libte.XferList of %zu pieces of segment %d>", xl->n, (int)xl->segment);
}

static PySequenceMethods xl_as_seq = {
	.sq_length = (lenfunc)xl_len,
};

static PyMemberDef xl_members[] = {
	{ "segment", T_INT, offsetof(PyteXferList, segment), READONLY, "The segment id its pieces lie in (0: local memory)." },
	{ NULL, 0, 0, 0, NULL },
};

PyTypeObject PyteXferListType = {
	PYTE_TYPE_HEAD("libte.XferList", PyteXferList, xl_dealloc, xl_repr),
	.tp_as_sequence = &xl_as_seq,
	.tp_doc = "Pieces of one segment checked and resolved once (from Engine.prepare), posted many times\n"
		  "with Batch.submit_prepared. len() is the number of pieces.",
	.tp_members = xl_members,
};
