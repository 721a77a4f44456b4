/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte.Batch, the parsing of requests, and the synchronous helpers
 * (Engine.read/write/read_many/write_many/transfer). Requests are parsed into
 * a te_request array before the engine is entered, so the GIL is released
 * for the whole of submit + wait and Python threads move data in parallel.
 */
#include "pyte.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static const char *const state_names[] = { "WAITING", "PENDING", "INVALID", "CANCELED", "COMPLETED", "TIMEOUT", "FAILED" };

static const char *state_name(int s)
{
	return s >= 0 && s <= 6 ? state_names[s] : "?";
}

/* ------------------------------------------------------------ arguments */

int pyte_local_addr(PyObject *o, uint64_t *addr, int64_t *len)
{
	if (PyLong_Check(o)) {
		*addr = PyLong_AsUnsignedLongLong(o);
		*len = -1;
		return PyErr_Occurred() ? -1 : 0;
	}
	if (!PyObject_CheckBuffer(o)) {
		PyErr_Format(PyExc_TypeError, "local memory is an int address or a buffer object, not %.100s",
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	/* The address only: the registration holds the buffer itself. */
	Py_buffer v;
	if (PyObject_GetBuffer(o, &v, PyBUF_SIMPLE) < 0)
		return -1;
	*addr = (uintptr_t)v.buf;
	*len = (int64_t)v.len;
	PyBuffer_Release(&v);
	return 0;
}

typedef struct reqs {
	te_request *r;
	size_t n;
	uint64_t lo, hi; /* local addresses touched */
	te_request stack[32];
} reqs;

static int reqs_init(reqs *q, size_t n)
{
	q->n = n;
	q->lo = UINT64_MAX;
	q->hi = 0;
	q->r = n <= 32 ? q->stack : PyMem_Malloc(n * sizeof *q->r);
	if (q->r == NULL) {
		PyErr_NoMemory();
		return -1;
	}
	return 0;
}

static void reqs_free(reqs *q)
{
	if (q->r != q->stack)
		PyMem_Free(q->r);
	q->r = NULL;
}

static void reqs_span(reqs *q, const te_request *r)
{
	uint64_t a = (uintptr_t)r->local;
	if (r->length == 0)
		return;
	if (a < q->lo)
		q->lo = a;
	if (a + r->length > q->hi || a + r->length < a)
		q->hi = a + r->length < a ? UINT64_MAX : a + r->length;
}

static int parse_opcode(PyObject *o, uint32_t *op)
{
	long v = PyLong_AsLong(o);
	if (v == -1 && PyErr_Occurred())
		return -1;
	if (v != TE_OP_READ && v != TE_OP_WRITE) {
		PyErr_Format(PyExc_ValueError, "opcode %ld: want libte.READ (0) or libte.WRITE (1)", v);
		return -1;
	}
	*op = (uint32_t)v;
	return 0;
}

/* A request's segment, local memory and length (opcode and remote are the
 * caller's); a length of None stands for a buffer object's whole length.
 * `what` begins the messages. */
static int fill_request(te_request *r, PyObject *seg_o, PyObject *local_o, PyObject *length_o, const char *what)
{
	uint64_t local;
	int64_t blen;

	if (pyte_segment_id(seg_o, &r->segment) < 0 || pyte_local_addr(local_o, &local, &blen) < 0)
		return -1;
	r->local = (void *)(uintptr_t)local;
	if (length_o == Py_None) {
		if (blen < 0) {
			PyErr_Format(PyExc_TypeError, "%s: an int local address needs a length", what);
			return -1;
		}
		r->length = (uint64_t)blen;
		return 0;
	}
	r->length = PyLong_AsUnsignedLongLong(length_o);
	if (PyErr_Occurred())
		return -1;
	if (blen >= 0 && r->length > (uint64_t)blen) {
		PyErr_Format(PyExc_ValueError, "%s: length %llu exceeds the local buffer's %lld bytes", what,
			     (unsigned long long)r->length, (long long)blen);
		return -1;
	}
	return 0;
}

/* One (opcode, segment, local, remote, length) item. */
static int parse_one(PyObject *item, te_request *r)
{
	PyObject *fast = PySequence_Fast(item, "a request is an (opcode, segment, local, remote, length) sequence");
	int rc = -1;
	if (fast == NULL)
		return -1;
	if (PySequence_Fast_GET_SIZE(fast) != 5) {
		PyErr_Format(PyExc_ValueError, "a request has 5 fields (opcode, segment, local, remote, length), not %zd",
			     PySequence_Fast_GET_SIZE(fast));
		goto out;
	}
	PyObject **f = PySequence_Fast_ITEMS(fast);
	if (parse_opcode(f[0], &r->opcode) < 0 || fill_request(r, f[1], f[2], f[4], "request") < 0)
		goto out;
	r->remote = PyLong_AsUnsignedLongLong(f[3]);
	if (PyErr_Occurred())
		goto out;
	rc = 0;
out:
	Py_DECREF(fast);
	return rc;
}

static int parse_requests(PyObject *seq, reqs *q)
{
	PyObject *fast = PySequence_Fast(seq, "requests must be a sequence of (opcode, segment, local, remote, length)");
	if (fast == NULL)
		return -1;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
	if (reqs_init(q, (size_t)n) < 0)
		goto fail;
	for (Py_ssize_t i = 0; i < n; i++) {
		if (parse_one(PySequence_Fast_GET_ITEM(fast, i), &q->r[i]) < 0) {
			reqs_free(q);
			goto fail;
		}
		reqs_span(q, &q->r[i]);
	}
	Py_DECREF(fast);
	return 0;
fail:
	Py_DECREF(fast);
	return -1;
}

/* A column of numbers: a sequence of ints, or a 1-D array of 8-byte
 * integers (array('Q'), numpy uint64/int64), read without a Python object
 * per element. */
typedef struct col {
	PyObject *fast;
	Py_buffer view;
	int has_view;
	Py_ssize_t n;
} col;

static int col_open(PyObject *o, col *c, const char *what)
{
	memset(c, 0, sizeof *c);
	if (PyObject_CheckBuffer(o) && !PyUnicode_Check(o)) {
		if (PyObject_GetBuffer(o, &c->view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
			return -1;
		c->has_view = 1;
		const char *fmt = c->view.format ? c->view.format : "B";
		if (*fmt == '@' || *fmt == '=' || *fmt == '<')
			fmt++;
		if (c->view.ndim != 1 || c->view.itemsize != 8 || strchr("QqLlKk", *fmt) == NULL || fmt[1] != '\0') {
			PyErr_Format(PyExc_TypeError,
				     "%s: an array must hold 8-byte integers (format 'Q'), not format '%s' of %zd-byte items",
				     what, c->view.format ? c->view.format : "B", c->view.itemsize);
			PyBuffer_Release(&c->view);
			c->has_view = 0;
			return -1;
		}
		c->n = c->view.len / 8;
		return 0;
	}
	char msg[128];
	snprintf(msg, sizeof msg, "%s must be a sequence of ints or an array of uint64", what);
	c->fast = PySequence_Fast(o, msg);
	if (c->fast == NULL)
		return -1;
	c->n = PySequence_Fast_GET_SIZE(c->fast);
	return 0;
}

static void col_close(col *c)
{
	if (c->has_view)
		PyBuffer_Release(&c->view);
	Py_XDECREF(c->fast);
}

static int col_get(col *c, Py_ssize_t i, uint64_t *out)
{
	if (c->has_view) {
		memcpy(out, (const char *)c->view.buf + i * 8, 8);
		return 0;
	}
	*out = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(c->fast, i));
	return PyErr_Occurred() ? -1 : 0;
}

/* op, segment, locals, remotes, lengths (a sequence, an array or one int). */
static int parse_columns(uint32_t op, PyObject *seg_o, PyObject *locals, PyObject *remotes, PyObject *lengths,
			 reqs *q)
{
	te_segment_id seg;
	col lc = { 0 }, rc = { 0 }, nc = { 0 };
	int one_len = PyLong_Check(lengths), ret = -1;
	uint64_t len_all = 0;

	if (pyte_segment_id(seg_o, &seg) < 0)
		return -1;
	if (one_len) {
		len_all = PyLong_AsUnsignedLongLong(lengths);
		if (PyErr_Occurred())
			return -1;
	}
	if (col_open(locals, &lc, "locals") < 0)
		return -1;
	if (col_open(remotes, &rc, "remotes") < 0 || (!one_len && col_open(lengths, &nc, "lengths") < 0))
		goto out;
	if (rc.n != lc.n || (!one_len && nc.n != lc.n)) {
		PyErr_Format(PyExc_ValueError, "locals, remotes and lengths differ in length (%zd, %zd, %zd)", lc.n, rc.n,
			     one_len ? lc.n : nc.n);
		goto out;
	}
	if (reqs_init(q, (size_t)lc.n) < 0)
		goto out;
	for (Py_ssize_t i = 0; i < lc.n; i++) {
		te_request *r = &q->r[i];
		uint64_t local;
		int64_t blen = -1;
		r->opcode = op;
		r->segment = seg;
		if (lc.has_view) {
			col_get(&lc, i, &local);
		} else if (pyte_local_addr(PySequence_Fast_GET_ITEM(lc.fast, i), &local, &blen) < 0) {
			goto bad;
		}
		r->local = (void *)(uintptr_t)local;
		if (col_get(&rc, i, &r->remote) < 0)
			goto bad;
		if (one_len)
			r->length = len_all;
		else if (col_get(&nc, i, &r->length) < 0)
			goto bad;
		if (blen >= 0 && r->length > (uint64_t)blen) {
			PyErr_Format(PyExc_ValueError, "request %zd: length %llu exceeds the local buffer's %lld bytes", i,
				     (unsigned long long)r->length, (long long)blen);
			goto bad;
		}
		reqs_span(q, r);
	}
	ret = 0;
	goto out;
bad:
	reqs_free(q);
out:
	col_close(&lc);
	col_close(&rc);
	col_close(&nc);
	return ret;
}

/* ----------------------------------------------------------- outcomes */

/* What a finished batch's tasks came to; filled with the GIL released. */
typedef struct outcome {
	int rc;          /* a call that failed (0: none) */
	const char *call;
	int state;       /* worst task state */
	size_t task;     /* first task that did not complete */
	te_task_status st;
	int timed_out;   /* a task ended at its deadline (TE_TASK_ENDED_EARLY, -ETIMEDOUT) */
	int unsettled;   /* a WRITE so ended may still change the peer's memory */
	char detail[512]; /* libte's last error line on this thread */
} outcome;

static void outcome_tasks(te_engine *e, te_batch_id id, size_t n, outcome *oc)
{
	int32_t state = TE_TASK_COMPLETED;
	te_batch_status(e, id, NULL, NULL, &state);
	oc->state = state;
	if (state == TE_TASK_COMPLETED)
		return;
	int first = 1;
	for (size_t i = 0; i < n; i++) {
		te_task_info ti = { .size = sizeof ti };
		if (te_get_task_info(e, id, i, &ti) < 0 || ti.state == TE_TASK_COMPLETED)
			continue;
		if (first) {
			oc->task = i;
			oc->st = (te_task_status){ .state = ti.state, .error = ti.error, .transferred = ti.transferred };
			first = 0;
		}
		if ((ti.flags & TE_TASK_ENDED_EARLY) && ti.error == -ETIMEDOUT)
			oc->timed_out = 1;
		if (ti.flags & TE_TASK_UNSETTLED)
			oc->unsettled = 1;
	}
}

/* Every task's status, for TransferError.statuses (GIL held, engine entered). */
static PyObject *all_statuses(PyteEngine *eo, te_batch_id id, size_t n)
{
	PyObject *list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list != NULL && i < n; i++) {
		te_task_status st = { 0 };
		te_get_status(eo->e, id, i, &st);
		PyObject *o = pyte_task_status(&st);
		if (o == NULL)
			Py_CLEAR(list);
		else
			PyList_SET_ITEM(list, (Py_ssize_t)i, o);
	}
	return list;
}

/* Raises for a batch whose tasks did not all complete: the class of the
 * task's error for a request refused at submit (INVALID), TimeoutError for
 * TIMEOUT, TransferError otherwise; with .task and .statuses (GIL held,
 * engine entered). */
static PyObject *raise_tasks(PyteEngine *eo, te_batch_id id, const outcome *oc, const char *what, size_t n)
{
	int code = oc->st.error ? oc->st.error : -EIO;
	PyObject *cls = oc->st.state == TE_TASK_INVALID	   ? pyte_error_class(code)
			: oc->st.state == TE_TASK_TIMEOUT ? pyte_error_class(-ETIMEDOUT)
							  : PyteTransferError;
	PyObject *msg = oc->detail[0]
		? PyUnicode_FromFormat("%s: task %zu of %zu ended %s: %s [%s]", what, oc->task, n,
				       state_name(oc->st.state), te_strerror(code), oc->detail)
		: PyUnicode_FromFormat("%s: task %zu of %zu ended %s: %s", what, oc->task, n, state_name(oc->st.state),
				       te_strerror(code));
	if (msg == NULL)
		return NULL;
	PyObject *exc = PyObject_CallOneArg(cls, msg);
	Py_DECREF(msg);
	if (exc == NULL)
		return NULL;
	PyObject *statuses = all_statuses(eo, id, n);
	PyObject *c = PyLong_FromLong(code), *t = PyLong_FromSize_t(oc->task),
		 *d = PyUnicode_DecodeUTF8(oc->detail, (Py_ssize_t)strlen(oc->detail), "replace");
	if (c && t && d && PyObject_SetAttrString(exc, "code", c) == 0 && PyObject_SetAttrString(exc, "task", t) == 0 &&
	    PyObject_SetAttrString(exc, "detail", d) == 0 &&
	    PyObject_SetAttrString(exc, "statuses", statuses ? statuses : Py_None) == 0)
		PyErr_SetObject(cls, exc);
	Py_XDECREF(statuses);
	Py_XDECREF(c);
	Py_XDECREF(t);
	Py_XDECREF(d);
	Py_DECREF(exc);
	return NULL;
}

/* ------------------------------------------------------ sync transfers */

/* How long past a sync call's deadline it waits for the host to end the
 * tasks (it does within milliseconds on a transport that honours
 * deadlines) before it cancels them itself. */
#define SYNC_GRACE_S 0.1

/* Runs `q` as one batch with the deadline `timeout` seconds from now (none
 * when < 0) and waits for it. GIL held on entry and exit. */
static PyObject *run_sync(PyteEngine *eo, reqs *q, double timeout, const char *what)
{
	outcome oc = { 0 };
	te_batch_id id = TE_INVALID_BATCH;
	pyte_use use = { .lo = q->lo, .hi = q->hi };
	PyObject *ret = NULL;
	int wrc = 0;

	if (q->n == 0)
		Py_RETURN_NONE;
	if (pyte_enter(eo) < 0)
		return NULL;
	PyThreadState *save = PyEval_SaveThread();
	int64_t deadline = timeout < 0 ? 0 : pyte_deadline_after(timeout);
	int rc = te_batch_alloc(eo->e, q->n, &id);
	if (rc < 0) {
		oc.rc = rc;
		oc.call = "te_batch_alloc";
	} else {
		use.batch = id;
		pthread_rwlock_rdlock(&eo->sublock);
		pyte_use_link(eo, &use);
		rc = te_submit_by(eo->e, id, q->r, q->n, deadline);
		pthread_rwlock_unlock(&eo->sublock);
		if (rc < 0) {
			oc.rc = rc;
			oc.call = "te_submit_by";
		} else {
			/* The host ends the tasks at the deadline; the wait covers
			 * that and a grace for a transport that does not honour
			 * deadlines. */
			wrc = pyte_wait(eo, id, timeout < 0 ? -1 : timeout + SYNC_GRACE_S, &save);
			if (wrc != 0) {
				/* Past the grace, interrupted or closing: stop the batch
				 * and let it settle, so no transfer touches the buffers
				 * after this returns. */
				te_batch_cancel(eo->e, id);
				te_batch_wait(eo->e, id, -1);
			}
			outcome_tasks(eo->e, id, q->n, &oc);
		}
		snprintf(oc.detail, sizeof oc.detail, "%s", te_last_error());
		pyte_use_unlink(eo, &use);
	}
	PyEval_RestoreThread(save);
	if (wrc == -EINTR) { /* the signal handler's exception is set */
		ret = NULL;
	} else if (oc.rc < 0) {
		pyte_raise_msg(oc.rc, "%s: %s failed: %s", what, oc.call, te_strerror(oc.rc));
	} else if (wrc == PYTE_CLOSED) {
		pyte_raise_msg(wrc, "%s: the engine was closed", what);
	} else if (wrc == -ETIMEDOUT || oc.timed_out) {
		pyte_raise_msg(-ETIMEDOUT, "%s: not finished within the timeout (%lld ms)%s", what,
			       (long long)(timeout * 1000.0 + 0.5), oc.unsettled ? "; bytes of a write may still reach the peer" : "");
	} else if (wrc < 0) {
		pyte_raise_msg(wrc, "%s: waiting failed: %s", what, te_strerror(wrc));
	} else if (oc.state != TE_TASK_COMPLETED) {
		raise_tasks(eo, id, &oc, what, q->n);
	} else {
		ret = Py_NewRef(Py_None);
	}
	if (id != TE_INVALID_BATCH)
		te_batch_free(eo->e, id);
	pyte_leave(eo);
	return ret;
}

PyObject *pyte_engine_transfer(PyteEngine *eo, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "requests", "timeout", NULL };
	PyObject *seq;
	double timeout = -1;
	reqs q;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$O&:transfer", kwlist, &seq, pyte_timeout_arg, &timeout) ||
	    parse_requests(seq, &q) < 0)
		return NULL;
	PyObject *r = run_sync(eo, &q, timeout, "transfer");
	reqs_free(&q);
	return r;
}

static PyObject *one(PyteEngine *eo, PyObject *args, PyObject *kw, uint32_t op, const char *what)
{
	static char *kwlist[] = { "segment", "local", "remote", "length", "timeout", NULL };
	PyObject *seg_o, *local_o, *length_o = Py_None;
	unsigned long long remote;
	double timeout = -1;
	reqs q;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOK|O$O&", kwlist, &seg_o, &local_o, &remote, &length_o,
					 pyte_timeout_arg, &timeout) ||
	    reqs_init(&q, 1) < 0)
		return NULL;
	te_request *r = &q.r[0];
	r->opcode = op;
	r->remote = remote;
	if (fill_request(r, seg_o, local_o, length_o, what) < 0)
		return NULL;
	reqs_span(&q, r);
	return run_sync(eo, &q, timeout, what);
}

PyObject *pyte_engine_read(PyteEngine *eo, PyObject *args, PyObject *kw)
{
	return one(eo, args, kw, TE_OP_READ, "read");
}

PyObject *pyte_engine_write(PyteEngine *eo, PyObject *args, PyObject *kw)
{
	return one(eo, args, kw, TE_OP_WRITE, "write");
}

static PyObject *many(PyteEngine *eo, PyObject *args, PyObject *kw, uint32_t op, const char *what)
{
	static char *kwlist[] = { "segment", "locals", "remotes", "lengths", "timeout", NULL };
	PyObject *seg_o, *locals, *remotes, *lengths;
	double timeout = -1;
	reqs q;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$O&", kwlist, &seg_o, &locals, &remotes, &lengths,
					 pyte_timeout_arg, &timeout) ||
	    parse_columns(op, seg_o, locals, remotes, lengths, &q) < 0)
		return NULL;
	PyObject *r = run_sync(eo, &q, timeout, what);
	reqs_free(&q);
	return r;
}

PyObject *pyte_engine_read_many(PyteEngine *eo, PyObject *args, PyObject *kw)
{
	return many(eo, args, kw, TE_OP_READ, "read_many");
}

PyObject *pyte_engine_write_many(PyteEngine *eo, PyObject *args, PyObject *kw)
{
	return many(eo, args, kw, TE_OP_WRITE, "write_many");
}

/* ---------------------------------------------------------------- Batch */

typedef struct {
	PyObject_HEAD
	PyteEngine *engine;
	te_batch_id id;
	size_t capacity;
	char freed; /* a char: T_BOOL reads one */
	pyte_use use; /* linked into the engine's list until freed */
} PyteBatch;

PyObject *pyte_batch_new(PyteEngine *eo, size_t capacity)
{
	/* The object first, freed: when it cannot be made, there is no batch to
	 * undo, and when the allocation fails, its dealloc leaves libte alone. */
	PyteBatch *b = PyObject_New(PyteBatch, &PyteBatchType);
	if (b == NULL)
		return NULL;
	b->engine = (PyteEngine *)Py_NewRef((PyObject *)eo);
	b->id = TE_INVALID_BATCH;
	b->capacity = capacity;
	b->freed = 1;
	if (pyte_enter(eo) < 0) {
		Py_DECREF(b);
		return NULL;
	}
	int rc = te_batch_alloc(eo->e, capacity, &b->id);
	pyte_leave(eo);
	if (rc < 0) {
		pyte_raise_msg(rc, "batch(%zu): %s", capacity, te_strerror(rc));
		Py_DECREF(b);
		return NULL;
	}
	b->freed = 0;
	b->use = (pyte_use){ .batch = b->id, .lo = UINT64_MAX, .hi = 0 };
	pyte_use_link(eo, &b->use);
	return (PyObject *)b;
}

/* -1 with BatchError when the batch was freed. */
static int batch_live(PyteBatch *b)
{
	if (b->freed) {
		pyte_raise_msg(TE_ERR_BATCH, "batch %llu was freed", (unsigned long long)b->id);
		return -1;
	}
	return 0;
}

static int batch_ready(PyteBatch *b)
{
	return batch_live(b) < 0 ? -1 : pyte_enter(b->engine);
}

/* Waits for the batch's tasks and frees it. GIL held. Returns 0, or -1 with
 * an exception (KeyboardInterrupt) and the batch still allocated. */
static int batch_finish(PyteBatch *b, int cancel)
{
	PyteEngine *eo = b->engine;
	int rc;

	if (b->freed)
		return 0;
	if (pyte_enter(eo) < 0) { /* the engine is gone, and the batch with it */
		PyErr_Clear();
		pyte_use_unlink(eo, &b->use);
		b->freed = 1;
		return 0;
	}
	PyThreadState *save = PyEval_SaveThread();
	if (cancel)
		te_batch_cancel(eo->e, b->id);
	rc = pyte_wait(eo, b->id, -1, &save);
	if (rc == 0 || rc == PYTE_CLOSED) {
		pyte_use_unlink(eo, &b->use);
		if (rc == 0)
			te_batch_free(eo->e, b->id);
		b->freed = 1;
	}
	PyEval_RestoreThread(save);
	pyte_leave(eo);
	return rc == -EINTR ? -1 : 0;
}

static void batch_dealloc(PyteBatch *b)
{
	/* Dropped without free(): its tasks still read or write registered
	 * memory, so let them finish first (no cancel: the caller may only
	 * have lost interest in the handle). */
	PyObject *et, *ev, *tb;
	PyErr_Fetch(&et, &ev, &tb);
	if (batch_finish(b, 0) < 0) {
		PyErr_Clear();
		pyte_use_unlink(b->engine, &b->use); /* interrupted: leave it to the engine's close */
	}
	PyErr_Restore(et, ev, tb);
	Py_XDECREF(b->engine);
	PyObject_Free(b);
}

/* te_submit_by(), or te_submit_on_stream() with a location. */
static PyObject *submit_reqs(PyteBatch *b, reqs *q, const char *location, void *stream, int64_t deadline)
{
	PyteEngine *eo = b->engine;
	int rc;

	if (batch_ready(b) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	pthread_rwlock_rdlock(&eo->sublock);
	pyte_use_widen(eo, &b->use, q->lo, q->hi);
	rc = location != NULL ? te_submit_on_stream(eo->e, b->id, q->r, q->n, location, stream)
			      : te_submit_by(eo->e, b->id, q->r, q->n, deadline);
	pthread_rwlock_unlock(&eo->sublock);
	Py_END_ALLOW_THREADS
	pyte_leave(eo);
	if (rc < 0)
		return pyte_raise_msg(rc, "Batch.%s(%zu requests): %s", location ? "submit_on_stream" : "submit",
				      q->n, te_strerror(rc));
	return PyLong_FromLong(rc);
}

static PyObject *batch_submit(PyteBatch *b, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "requests", "deadline", NULL };
	PyObject *seq;
	int64_t deadline = 0;
	reqs q;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$O&:submit", kwlist, &seq, pyte_deadline_arg, &deadline) ||
	    parse_requests(seq, &q) < 0)
		return NULL;
	PyObject *r = submit_reqs(b, &q, NULL, NULL, deadline);
	reqs_free(&q);
	return r;
}

static PyObject *batch_submit_on_stream(PyteBatch *b, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "requests", "location", "stream", NULL };
	PyObject *seq, *stream_o;
	const char *loc;
	reqs q;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OsO", kwlist, &seq, &loc, &stream_o))
		return NULL;
	void *stream = PyLong_AsVoidPtr(stream_o);
	if (stream == NULL && PyErr_Occurred())
		return NULL;
	if (parse_requests(seq, &q) < 0)
		return NULL;
	PyObject *r = submit_reqs(b, &q, loc, stream, 0);
	reqs_free(&q);
	return r;
}

static PyObject *submit_cols(PyteBatch *b, PyObject *args, PyObject *kw, uint32_t op)
{
	static char *kwlist[] = { "segment", "locals", "remotes", "lengths", "deadline", NULL };
	PyObject *seg_o, *locals, *remotes, *lengths;
	int64_t deadline = 0;
	reqs q;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|$O&", kwlist, &seg_o, &locals, &remotes, &lengths,
					 pyte_deadline_arg, &deadline) ||
	    parse_columns(op, seg_o, locals, remotes, lengths, &q) < 0)
		return NULL;
	PyObject *r = submit_reqs(b, &q, NULL, NULL, deadline);
	reqs_free(&q);
	return r;
}

static PyObject *batch_submit_read(PyteBatch *b, PyObject *args, PyObject *kw)
{
	return submit_cols(b, args, kw, TE_OP_READ);
}

static PyObject *batch_submit_write(PyteBatch *b, PyObject *args, PyObject *kw)
{
	return submit_cols(b, args, kw, TE_OP_WRITE);
}

static PyObject *batch_submit_prepared(PyteBatch *b, PyObject *args, PyObject *kw)
{
	if (batch_ready(b) < 0)
		return NULL;
	PyObject *r = pyte_submit_prepared(b->engine, b->id, &b->use, args, kw);
	pyte_leave(b->engine);
	return r;
}

/* Batch.status(task) and Batch.info(task): one task's TaskStatus, or its
 * TaskInfo when `info`. */
static PyObject *batch_task(PyteBatch *b, PyObject *arg, bool info)
{
	te_task_info ti = { .size = sizeof ti };
	te_task_status st;
	Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
	if (i == -1 && PyErr_Occurred())
		return NULL;
	if (i < 0) {
		PyErr_Format(PyExc_IndexError, "task %zd: task ids start at 0", i);
		return NULL;
	}
	if (batch_ready(b) < 0)
		return NULL;
	int rc = info ? te_get_task_info(b->engine->e, b->id, (size_t)i, &ti)
		      : te_get_status(b->engine->e, b->id, (size_t)i, &st);
	pyte_leave(b->engine);
	if (rc == -ERANGE) {
		PyErr_Format(PyExc_IndexError, "task %zd was not submitted to this batch", i);
		return NULL;
	}
	if (rc < 0)
		return pyte_raise(rc, info ? "Batch.info()" : "Batch.status()");
	return info ? pyte_task_info(&ti) : pyte_task_status(&st);
}

static PyObject *batch_status(PyteBatch *b, PyObject *arg)
{
	return batch_task(b, arg, false);
}

static PyObject *batch_info(PyteBatch *b, PyObject *arg)
{
	return batch_task(b, arg, true);
}

static PyObject *batch_set_deadline(PyteBatch *b, PyObject *arg)
{
	if (!PyLong_Check(arg)) {
		PyErr_Format(PyExc_TypeError, "set_deadline(): an int (libte.now_ns() nanoseconds, 0: none), not %.100s",
			     Py_TYPE(arg)->tp_name);
		return NULL;
	}
	int overflow = 0;
	long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
	if (v == -1 && PyErr_Occurred())
		return NULL;
	if (overflow != 0)
		return pyte_raise_msg(-EINVAL, "Batch.set_deadline(%S): not a libte.now_ns() time", arg);
	if (batch_ready(b) < 0)
		return NULL;
	/* libte checks the value (-EINVAL for a negative one) */
	int rc = te_batch_set_deadline(b->engine->e, b->id, (int64_t)v);
	pyte_leave(b->engine);
	if (rc < 0)
		return pyte_raise_msg(rc, "Batch.set_deadline(%lld): %s", v, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *batch_statuses(PyteBatch *b, PyObject *unused)
{
	(void)unused;
	size_t n = 0;
	if (batch_ready(b) < 0)
		return NULL;
	te_batch_status(b->engine->e, b->id, &n, NULL, NULL);
	PyObject *r = all_statuses(b->engine, b->id, n);
	pyte_leave(b->engine);
	return r;
}

static PyObject *batch_counts(PyteBatch *b, int which)
{
	size_t submitted = 0, inflight = 0;
	int32_t state = 0;
	if (batch_ready(b) < 0)
		return NULL;
	int rc = te_batch_status(b->engine->e, b->id, &submitted, &inflight, &state);
	pyte_leave(b->engine);
	if (rc < 0)
		return pyte_raise(rc, "Batch status");
	return which == 0 ? PyLong_FromSize_t(submitted) : which == 1 ? PyLong_FromSize_t(inflight) : PyLong_FromLong(state);
}

static Py_ssize_t batch_len(PyteBatch *b)
{
	PyObject *n = batch_counts(b, 0);
	if (n == NULL)
		return -1;
	Py_ssize_t r = PyLong_AsSsize_t(n);
	Py_DECREF(n);
	return r;
}

static PyObject *batch_get_submitted(PyteBatch *b, void *c)
{
	(void)c;
	return batch_counts(b, 0);
}

static PyObject *batch_get_in_flight(PyteBatch *b, void *c)
{
	(void)c;
	return batch_counts(b, 1);
}

static PyObject *batch_get_state(PyteBatch *b, void *c)
{
	(void)c;
	return batch_counts(b, 2);
}

static PyObject *batch_get_id(PyteBatch *b, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(b->id);
}

/* Batch.wait() and Batch.wait_settled(): True when done, False at the
 * timeout. */
static PyObject *batch_wait_how(PyteBatch *b, PyObject *args, PyObject *kw, bool settled)
{
	static char *kwlist[] = { "timeout", NULL };
	double timeout = -1;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, settled ? "|O&:wait_settled" : "|O&:wait", kwlist, pyte_timeout_arg,
					 &timeout) ||
	    batch_ready(b) < 0)
		return NULL;
	PyThreadState *save = PyEval_SaveThread();
	rc = settled ? pyte_wait_settled(b->engine, b->id, timeout, &save)
		     : pyte_wait(b->engine, b->id, timeout, &save);
	PyEval_RestoreThread(save);
	pyte_leave(b->engine);
	if (rc == 0)
		Py_RETURN_TRUE;
	if (rc == -ETIMEDOUT)
		Py_RETURN_FALSE;
	if (rc == -EINTR)
		return NULL;
	return pyte_raise(rc, settled ? "Batch.wait_settled()" : "Batch.wait()");
}

static PyObject *batch_wait(PyteBatch *b, PyObject *args, PyObject *kw)
{
	return batch_wait_how(b, args, kw, false);
}

static PyObject *batch_wait_settled(PyteBatch *b, PyObject *args, PyObject *kw)
{
	return batch_wait_how(b, args, kw, true);
}

static PyObject *batch_check(PyteBatch *b, PyObject *unused)
{
	(void)unused;
	outcome oc = { 0 };
	size_t submitted = 0, inflight = 0;

	if (batch_ready(b) < 0)
		return NULL;
	te_batch_status(b->engine->e, b->id, &submitted, &inflight, NULL);
	if (inflight > 0) {
		pyte_leave(b->engine);
		return pyte_raise_msg(-EBUSY, "Batch.check(): %zu of %zu tasks still in flight; wait() first", inflight,
				      submitted);
	}
	outcome_tasks(b->engine->e, b->id, submitted, &oc);
	int failed = oc.state != TE_TASK_COMPLETED;
	if (failed)
		raise_tasks(b->engine, b->id, &oc, "Batch.check()", submitted);
	pyte_leave(b->engine);
	return failed ? NULL : Py_NewRef(Py_None);
}

static PyObject *batch_cancel(PyteBatch *b, PyObject *unused)
{
	(void)unused;
	if (batch_ready(b) < 0)
		return NULL;
	int rc = te_batch_cancel(b->engine->e, b->id);
	pyte_leave(b->engine);
	if (rc < 0)
		return pyte_raise(rc, "Batch.cancel()");
	Py_RETURN_NONE;
}

static PyObject *batch_free(PyteBatch *b, PyObject *unused)
{
	(void)unused;
	if (b->freed)
		Py_RETURN_NONE;
	if (pyte_enter(b->engine) < 0) {
		/* the engine freed it when it closed */
		PyErr_Clear();
		pyte_use_unlink(b->engine, &b->use);
		b->freed = 1;
		Py_RETURN_NONE;
	}
	int rc = te_batch_free(b->engine->e, b->id);
	if (rc == 0) {
		pyte_use_unlink(b->engine, &b->use);
		b->freed = 1;
	}
	pyte_leave(b->engine);
	if (rc < 0)
		return pyte_raise_msg(rc, "Batch.free(): %s", rc == -EBUSY ? "tasks are still in flight; wait() or cancel() first"
									   : te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *batch_notify(PyteBatch *b, PyObject *args, PyObject *kw)
{
	return batch_live(b) < 0 ? NULL : pyte_notify(b->engine, b->id, args, kw);
}

static PyObject *batch_exit(PyteBatch *b, PyObject *args)
{
	PyObject *et = PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0) : Py_None;
	if (batch_finish(b, et != Py_None) < 0)
		return NULL;
	Py_RETURN_FALSE;
}

static PyObject *batch_repr(PyteBatch *b)
{
	return PyUnicode_FromFormat("<libte.Batch %llu capacity %zu%s>", (unsigned long long)b->id, b->capacity,
				    b->freed ? " freed" : "");
}

static PySequenceMethods batch_as_seq = { .sq_length = (lenfunc)batch_len };

static PyMethodDef batch_methods[] = {
	PYTE_KW_METHOD("submit", batch_submit,
	  "submit(requests, *, deadline=None)\n--\n\nAppends requests ((opcode, segment, local, remote, length) tuples or\n"
	  "Request) as tasks and starts them; returns how many were refused (INVALID: see status()).\n"
	  "`deadline` (libte.now_ns() nanoseconds; None: the batch's, see set_deadline) ends those still\n"
	  "in flight then, FAILED with -ETIMEDOUT (te_submit_by)."),
	PYTE_KW_METHOD("submit_on_stream", batch_submit_on_stream,
	  "submit_on_stream(requests, location, stream)\n--\n\nAppends requests as tasks that start once the work queued on\n"
	  "`stream` (an int: a CUstream of device `location`, \"cuda\") has finished; the stream's later work waits\n"
	  "for them. Returns at once (te_submit_on_stream)."),
	PYTE_KW_METHOD("submit_read", batch_submit_read,
	  "submit_read(segment, locals, remotes, lengths, *, deadline=None)\n--\n\nAppends reads given as columns (see\n"
	  "Engine.read_many); `deadline` as for submit()."),
	PYTE_KW_METHOD("submit_write", batch_submit_write,
	  "submit_write(segment, locals, remotes, lengths, *, deadline=None)\n--\n\nAppends writes given as columns."),
	PYTE_KW_METHOD("submit_prepared", batch_submit_prepared,
	  "submit_prepared(op, local, remote, local_idx=None, remote_idx=None, count=None)\n--\n\n"
	  "Posts pairs (piece local_idx[k] of XferList `local`, piece remote_idx[k] of `remote`) as "
	  "te_submit_prepared() does: indices are arrays of 4- or 8-byte integers or sequences; None means "
	  "0..count-1. Adjacent pairs merge into one task. Returns (first_task, tasks, invalid)."),
	{ "status", (PyCFunction)batch_status, METH_O, "status(task)\n--\n\nThe TaskStatus of task `task` (0-based)." },
	{ "statuses", (PyCFunction)batch_statuses, METH_NOARGS, "statuses()\n--\n\nEvery task's TaskStatus." },
	{ "info", (PyCFunction)batch_info, METH_O,
	  "info(task)\n--\n\nThe TaskInfo of task `task`: its status, flags (unsettled, ended_early) and deadline." },
	{ "set_deadline", (PyCFunction)batch_set_deadline, METH_O,
	  "set_deadline(deadline_ns)\n--\n\nTasks submitted from now on (submit_prepared and submit_on_stream too) end\n"
	  "by `deadline_ns` (libte.now_ns() nanoseconds) unless their submit gives one; 0 removes it.\n"
	  "InvalidArgumentError for a negative one." },
	PYTE_KW_METHOD("wait_settled", batch_wait_settled,
	  "wait_settled(timeout=None)\n--\n\nAs wait(), then also until no task is unsettled (a WRITE ended early\n"
	  "whose bytes the peer may still apply); False when `timeout` seconds passed first."),
	PYTE_KW_METHOD("wait", batch_wait,
	  "wait(timeout=None)\n--\n\nBlocks (GIL released) until no task is in flight; False when `timeout`\n"
	  "seconds passed first (the tasks go on: a deadline ends them)."),
	{ "check", (PyCFunction)batch_check, METH_NOARGS,
	  "check()\n--\n\nAfter wait(): raises (TransferError, AddressError, ...) when a task did not complete." },
	{ "cancel", (PyCFunction)batch_cancel, METH_NOARGS,
	  "cancel()\n--\n\nEnds the tasks still in flight CANCELED, within milliseconds on a transport that honours\n"
	  "deadlines (on another, running ones stop at their next slice). Returns at once; wait() to see them end." },
	{ "free", (PyCFunction)batch_free, METH_NOARGS,
	  "free()\n--\n\nFrees the batch; BusyError while tasks are in flight." },
	PYTE_KW_METHOD("notify", batch_notify,
	  "notify(segment, msg, *, sender=None)\n--\n\nSends `msg` to the segment's owner once the batch has drained."),
	{ "__enter__", pyte_return_self, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)batch_exit, METH_VARARGS,
	  "Leaving the block waits for the tasks (canceling them when an exception is on its way) and frees." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef batch_getset[] = {
	{ "id", (getter)batch_get_id, NULL, "libte's batch id.", NULL },
	{ "submitted", (getter)batch_get_submitted, NULL, "Tasks submitted so far.", NULL },
	{ "in_flight", (getter)batch_get_in_flight, NULL, "Tasks still moving.", NULL },
	{ "state", (getter)batch_get_state, NULL,
	  "COMPLETED when every task completed, the worst end state once all ended, else WAITING.", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

static PyMemberDef batch_members[] = {
	{ "capacity", T_PYSSIZET, offsetof(PyteBatch, capacity), READONLY, "Tasks it can hold over its life." },
	{ "freed", T_BOOL, offsetof(PyteBatch, freed), READONLY, "True after free()." },
	{ NULL, 0, 0, 0, NULL },
};

PyTypeObject PyteBatchType = {
	PYTE_TYPE_HEAD("libte.Batch", PyteBatch, batch_dealloc, batch_repr),
	.tp_as_sequence = &batch_as_seq,
	.tp_doc = "A set of transfers with a status each (from Engine.batch). len() is the number submitted.\n"
		  "A context manager: leaving the block waits and frees.",
	.tp_methods = batch_methods,
	.tp_members = batch_members,
	.tp_getset = batch_getset,
};
