/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte.Engine and libte.Segment.
 *
 * Thread safety: te.h calls are thread-safe, and every call that can block
 * runs with the GIL released, so Python threads transfer in parallel. The
 * one thing libte forbids is using an engine while it is destroyed: calls
 * count themselves in `active`, and close() waits until that drops to zero
 * (after canceling this engine's batches, so waiting calls end soon).
 */
#include "pyte.h"

#include <errno.h>
#include <string.h>

/* -------------------------------------------------------- active calls */

int pyte_enter(PyteEngine *eo)
{
	int ok;

	pthread_mutex_lock(&eo->mu);
	ok = eo->e != NULL && !atomic_load(&eo->closing);
	if (ok)
		eo->active++;
	pthread_mutex_unlock(&eo->mu);
	if (!ok) {
		pyte_raise(PYTE_CLOSED, "libte.Engine");
		return -1;
	}
	te_last_error_clear();
	return 0;
}

void pyte_leave(PyteEngine *eo)
{
	pthread_mutex_lock(&eo->mu);
	if (--eo->active == 0 && atomic_load(&eo->closing))
		pthread_cond_broadcast(&eo->idle); /* close() waits for this */
	pthread_mutex_unlock(&eo->mu);
}

/* For deallocators, which must not raise. */
static int try_enter(PyteEngine *eo)
{
	if (pyte_enter(eo) == 0)
		return 0;
	PyErr_Clear();
	return -1;
}

void pyte_use_link(PyteEngine *eo, pyte_use *u)
{
	pthread_mutex_lock(&eo->mu);
	u->next = eo->uses.next;
	u->prev = &eo->uses;
	eo->uses.next->prev = u;
	eo->uses.next = u;
	pthread_mutex_unlock(&eo->mu);
}

void pyte_use_unlink(PyteEngine *eo, pyte_use *u)
{
	pthread_mutex_lock(&eo->mu);
	if (u->next != NULL) {
		u->prev->next = u->next;
		u->next->prev = u->prev;
		u->next = u->prev = NULL;
	}
	pthread_mutex_unlock(&eo->mu);
}

int pyte_wait(PyteEngine *eo, te_batch_id id, double timeout_s, PyThreadState **save)
{
	/* Slices short enough that Ctrl-C and close() are noticed quickly; a
	 * batch that finishes within one slice costs one wait, as without them. */
	const int slice_ms = 100;
	double left_ms = timeout_s < 0 ? -1 : timeout_s * 1000.0;

	for (;;) {
		int ms = left_ms < 0 || left_ms > slice_ms ? slice_ms : (int)left_ms;
		int rc = te_batch_wait(eo->e, id, ms);
		if (rc != -ETIMEDOUT)
			return rc;
		if (atomic_load(&eo->closing))
			return PYTE_CLOSED;
		if (left_ms >= 0) {
			left_ms -= ms;
			if (left_ms <= 0)
				return -ETIMEDOUT;
		}
		PyEval_RestoreThread(*save);
		int sig = PyErr_CheckSignals();
		*save = PyEval_SaveThread();
		if (sig < 0)
			return -EINTR;
	}
}

/* ------------------------------------------------------------- helpers */

static const char *str_or_null(PyObject *o, const char *what)
{
	if (o == NULL || o == Py_None)
		return NULL;
	if (!PyUnicode_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s must be a str or None, not %.100s", what, Py_TYPE(o)->tp_name);
		return NULL;
	}
	return PyUnicode_AsUTF8(o);
}

/* Looks up a registration by its first address (mu held). */
static ssize_t reg_find(PyteEngine *eo, uint64_t addr)
{
	for (size_t i = 0; i < eo->nregs; i++)
		if (eo->regs[i].addr == addr)
			return (ssize_t)i;
	return -1;
}

static int reg_add(PyteEngine *eo, const pyte_reg *r)
{
	int rc = 0;
	pthread_mutex_lock(&eo->mu);
	if (eo->nregs == eo->capregs) {
		size_t cap = eo->capregs ? eo->capregs * 2 : 8;
		pyte_reg *n = PyMem_RawRealloc(eo->regs, cap * sizeof *n);
		if (n == NULL)
			rc = -1;
		else {
			eo->regs = n;
			eo->capregs = cap;
		}
	}
	if (rc == 0)
		eo->regs[eo->nregs++] = *r;
	pthread_mutex_unlock(&eo->mu);
	return rc;
}

/* Removes the registration at `addr`, copying it to *out. 0, or -1 if absent. */
static int reg_take(PyteEngine *eo, uint64_t addr, pyte_reg *out)
{
	int rc = -1;
	pthread_mutex_lock(&eo->mu);
	ssize_t i = reg_find(eo, addr);
	if (i >= 0) {
		*out = eo->regs[i];
		eo->regs[i] = eo->regs[--eo->nregs];
		rc = 0;
	}
	pthread_mutex_unlock(&eo->mu);
	return rc;
}

/* ------------------------------------------------------------ creation */

static int add_opt(te_option *opts, size_t *n, PyObject *keep, const char *k, PyObject *v)
{
	PyObject *s = PyUnicode_Check(v) ? Py_NewRef(v) : PyObject_Str(v);
	if (s == NULL)
		return -1;
	const char *val = PyUnicode_AsUTF8(s);
	if (val == NULL || PyList_Append(keep, s) < 0) {
		Py_DECREF(s);
		return -1;
	}
	Py_DECREF(s);
	opts[*n].key = k;
	opts[*n].value = val;
	(*n)++;
	return 0;
}

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "metadata", "name", "transports", "auto_discovery", "rpc_port", "address",
				  "options", NULL };
	PyObject *metadata_o = NULL, *name_o = Py_None, *transports = Py_None, *rpc_port = Py_None,
		 *address = Py_None, *options = Py_None;
	int auto_discovery = 0;
	const char *metadata = "P2PHANDSHAKE", *name;
	PyteEngine *self = NULL;
	PyObject *keep = NULL;
	te_option *opts = NULL;
	size_t nopts = 0;
	te_engine *e = NULL;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO$OpOOO:Engine", kwlist, &metadata_o, &name_o, &transports,
					 &auto_discovery, &rpc_port, &address, &options))
		return NULL;
	if (metadata_o != NULL && metadata_o != Py_None && (metadata = str_or_null(metadata_o, "metadata")) == NULL)
		return NULL;
	name = str_or_null(name_o, "name");
	if (name == NULL && PyErr_Occurred())
		return NULL;
	if (options != Py_None && !PyDict_Check(options)) {
		PyErr_SetString(PyExc_TypeError, "options must be a dict of str to str");
		return NULL;
	}
	keep = PyList_New(0);
	Py_ssize_t cap = 4 + (options != Py_None ? PyDict_Size(options) : 0);
	opts = PyMem_Calloc((size_t)cap, sizeof *opts);
	if (keep == NULL || opts == NULL)
		goto fail;
	if (transports != Py_None) {
		PyObject *t = transports;
		if (!PyUnicode_Check(t)) {
			/* a list of names: "tcp,rdma" */
			PyObject *sep = PyUnicode_FromString(",");
			t = sep ? PyUnicode_Join(sep, transports) : NULL;
			Py_XDECREF(sep);
			if (t == NULL)
				goto fail;
		} else {
			Py_INCREF(t);
		}
		rc = add_opt(opts, &nopts, keep, "transports", t);
		Py_DECREF(t);
		if (rc < 0)
			goto fail;
	}
	if (auto_discovery) {
		PyObject *one = PyUnicode_FromString("1");
		rc = one ? add_opt(opts, &nopts, keep, "auto_discovery", one) : -1;
		Py_XDECREF(one);
		if (rc < 0)
			goto fail;
	}
	if (rpc_port != Py_None && add_opt(opts, &nopts, keep, "rpc_port", rpc_port) < 0)
		goto fail;
	if (address != Py_None && add_opt(opts, &nopts, keep, "ip_or_host_name", address) < 0)
		goto fail;
	if (options != Py_None) {
		PyObject *k, *v;
		Py_ssize_t pos = 0;
		while (PyDict_Next(options, &pos, &k, &v)) {
			if (!PyUnicode_Check(k)) {
				PyErr_SetString(PyExc_TypeError, "options keys must be str");
				goto fail;
			}
			const char *ks = PyUnicode_AsUTF8(k);
			if (ks == NULL || add_opt(opts, &nopts, keep, ks, v) < 0)
				goto fail;
		}
	}
	self = (PyteEngine *)type->tp_alloc(type, 0);
	if (self == NULL)
		goto fail;
	pthread_mutex_init(&self->mu, NULL);
	pthread_cond_init(&self->idle, NULL);
	pthread_rwlockattr_t ra;
	pthread_rwlockattr_init(&ra);
	/* An unregister must not starve behind a stream of submits. */
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&self->sublock, &ra);
	pthread_rwlockattr_destroy(&ra);
	self->uses.next = self->uses.prev = &self->uses;

	te_last_error_clear();
	Py_BEGIN_ALLOW_THREADS
	rc = te_engine_create(metadata, name, opts, nopts, &e);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		pyte_raise_msg(rc, "Engine(%R, %R): %s", metadata_o ? metadata_o : Py_None, name_o, te_strerror(rc));
		Py_CLEAR(self);
		goto fail;
	}
	self->e = e;
	PyMem_Free(opts);
	Py_DECREF(keep);
	return (PyObject *)self;
fail:
	PyMem_Free(opts);
	Py_XDECREF(keep);
	return NULL;
}

/* Destroys the engine once no call is inside it; releases the buffers it
 * held registered. Idempotent. */
static void engine_shutdown(PyteEngine *eo)
{
	te_engine *e = NULL;
	pyte_reg *regs;
	size_t nregs;

	Py_BEGIN_ALLOW_THREADS
	pthread_mutex_lock(&eo->mu);
	if (eo->e != NULL && !atomic_exchange(&eo->closing, 1)) {
		/* Waiting calls wake within a slice (pyte_wait); canceled
		 * batches stop at their next slice boundary. */
		for (pyte_use *u = eo->uses.next; u != &eo->uses; u = u->next)
			te_batch_cancel(eo->e, u->batch);
		while (eo->active > 0)
			pthread_cond_wait(&eo->idle, &eo->mu);
		e = eo->e;
	} else {
		/* Another thread is closing it: return only once it is gone, as
		 * the caller may free what the engine still touches. */
		while (eo->e != NULL)
			pthread_cond_wait(&eo->idle, &eo->mu);
	}
	pthread_mutex_unlock(&eo->mu);
	if (e != NULL) {
		te_engine_destroy(e); /* fails what is still in flight, unregisters everything */
		pthread_mutex_lock(&eo->mu);
		eo->e = NULL;
		pthread_cond_broadcast(&eo->idle);
		pthread_mutex_unlock(&eo->mu);
	}
	Py_END_ALLOW_THREADS

	pthread_mutex_lock(&eo->mu);
	regs = eo->regs;
	nregs = eo->nregs;
	eo->regs = NULL;
	eo->nregs = eo->capregs = 0;
	pthread_mutex_unlock(&eo->mu);
	for (size_t i = 0; i < nregs; i++)
		if (regs[i].has_view)
			PyBuffer_Release(&regs[i].view);
	PyMem_RawFree(regs);
}

static void engine_dealloc(PyteEngine *self)
{
	if (self->weakreflist != NULL)
		PyObject_ClearWeakRefs((PyObject *)self);
	if (self->uses.next != NULL) { /* fully constructed */
		engine_shutdown(self);
		pthread_rwlock_destroy(&self->sublock);
		pthread_cond_destroy(&self->idle);
		pthread_mutex_destroy(&self->mu);
	}
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *engine_close(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	engine_shutdown(self);
	Py_RETURN_NONE;
}

static PyObject *engine_enter_ctx(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	if (self->e == NULL)
		return pyte_raise(PYTE_CLOSED, "Engine.__enter__");
	return Py_NewRef((PyObject *)self);
}

static PyObject *engine_exit_ctx(PyteEngine *self, PyObject *args)
{
	(void)args;
	engine_shutdown(self);
	Py_RETURN_FALSE;
}

/* ------------------------------------------------------------- getters */

static PyObject *engine_get_name(PyteEngine *self, void *c)
{
	(void)c;
	if (pyte_enter(self) < 0)
		return NULL;
	PyObject *r = PyUnicode_FromString(te_engine_name(self->e));
	pyte_leave(self);
	return r;
}

static PyObject *engine_get_address(PyteEngine *self, void *c)
{
	(void)c;
	if (pyte_enter(self) < 0)
		return NULL;
	PyObject *r = PyUnicode_FromString(te_engine_address(self->e));
	pyte_leave(self);
	return r;
}

static PyObject *engine_get_rpc_port(PyteEngine *self, void *c)
{
	(void)c;
	if (pyte_enter(self) < 0)
		return NULL;
	PyObject *r = PyLong_FromLong(te_engine_rpc_port(self->e));
	pyte_leave(self);
	return r;
}

static PyObject *engine_get_closed(PyteEngine *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->e == NULL || atomic_load(&self->closing));
}

static PyObject *engine_get_transports(PyteEngine *self, void *c)
{
	(void)c;
	const char *names[32];
	if (pyte_enter(self) < 0)
		return NULL;
	int n = te_transport_list(self->e, names, 32);
	PyObject *list = PyList_New(0);
	for (int i = 0; list != NULL && i < n && i < 32; i++) {
		PyObject *s = PyUnicode_FromString(names[i]);
		if (s == NULL || PyList_Append(list, s) < 0)
			Py_CLEAR(list);
		Py_XDECREF(s);
	}
	pyte_leave(self);
	return list;
}

/* ---------------------------------------------------------- transports */

static PyObject *engine_install(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "args", NULL };
	const char *name, *json = NULL;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|z:install", kwlist, &name, &json))
		return NULL;
	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_transport_install(self->e, name, json);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise_msg(rc, "install('%s'): %s", name, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *engine_uninstall(PyteEngine *self, PyObject *arg)
{
	const char *name = PyUnicode_AsUTF8(arg);
	int rc;

	if (name == NULL)
		return NULL;
	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_transport_uninstall(self->e, name);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise_msg(rc, "uninstall('%s'): %s", name, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *engine_install_auto(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	const char *got = NULL;
	int rc;

	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_transport_auto(self->e, &got);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise(rc, "install_auto()");
	if (got == NULL)
		Py_RETURN_NONE;
	return PyUnicode_FromString(got);
}

/* ------------------------------------------------------------ registry */

/* A registration from `obj`: a writable buffer (held for as long as it is
 * registered) or an int address with an explicit length. */
static int reg_from(PyObject *obj, PyObject *length, pyte_reg *r)
{
	memset(r, 0, sizeof *r);
	if (PyLong_Check(obj)) {
		if (length == NULL || length == Py_None) {
			PyErr_SetString(PyExc_TypeError, "register(address, length): an int address needs a length");
			return -1;
		}
		r->addr = PyLong_AsUnsignedLongLong(obj);
		if (PyErr_Occurred())
			return -1;
		r->length = PyLong_AsUnsignedLongLong(length);
		if (PyErr_Occurred())
			return -1;
		return 0;
	}
	/* Writable: a peer may write into it, which read-only objects (bytes)
	 * promise never happens. */
	if (PyObject_GetBuffer(obj, &r->view, PyBUF_WRITABLE) < 0)
		return -1;
	r->has_view = 1;
	r->addr = (uintptr_t)r->view.buf;
	r->length = (uint64_t)r->view.len;
	if (length != NULL && length != Py_None) {
		unsigned long long l = PyLong_AsUnsignedLongLong(length);
		if (PyErr_Occurred() || l > r->length) {
			if (!PyErr_Occurred())
				PyErr_Format(PyExc_ValueError, "register(): length %llu exceeds the buffer's %llu bytes",
					     l, (unsigned long long)r->length);
			PyBuffer_Release(&r->view);
			return -1;
		}
		r->length = l;
	}
	return 0;
}

static PyObject *engine_register(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "buffer", "length", "location", "remote", NULL };
	PyObject *obj, *length = Py_None;
	const char *location = "*";
	int remote = 1, rc;
	pyte_reg r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O$sp:register", kwlist, &obj, &length, &location, &remote))
		return NULL;
	if (reg_from(obj, length, &r) < 0)
		return NULL;
	if (pyte_enter(self) < 0)
		goto fail;
	Py_BEGIN_ALLOW_THREADS
	rc = te_register_memory(self->e, (void *)(uintptr_t)r.addr, r.length, location,
				remote ? TE_MEM_REMOTE_ACCESS : 0);
	Py_END_ALLOW_THREADS
	if (rc == 0 && reg_add(self, &r) < 0) {
		Py_BEGIN_ALLOW_THREADS
		te_unregister_memory(self->e, (void *)(uintptr_t)r.addr);
		Py_END_ALLOW_THREADS
		rc = -ENOMEM;
	}
	pyte_leave(self);
	if (rc < 0) {
		pyte_raise_msg(rc, "register(%p, %llu bytes): %s", (void *)(uintptr_t)r.addr,
			       (unsigned long long)r.length, te_strerror(rc));
		goto fail;
	}
	return PyLong_FromUnsignedLongLong(r.addr);
fail:
	if (r.has_view)
		PyBuffer_Release(&r.view);
	return NULL;
}

static PyObject *engine_register_many(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "buffers", "location", "remote", NULL };
	PyObject *seq, *fast = NULL, *out = NULL;
	const char *location = "*";
	int remote = 1, rc;
	pyte_reg *regs = NULL;
	te_memory_region *mr = NULL;
	Py_ssize_t n = 0, got = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$sp:register_many", kwlist, &seq, &location, &remote))
		return NULL;
	fast = PySequence_Fast(seq, "register_many() wants a sequence of buffers or (address, length) pairs");
	if (fast == NULL)
		return NULL;
	n = PySequence_Fast_GET_SIZE(fast);
	regs = PyMem_Calloc((size_t)(n ? n : 1), sizeof *regs);
	mr = PyMem_Calloc((size_t)(n ? n : 1), sizeof *mr);
	if (regs == NULL || mr == NULL) {
		PyErr_NoMemory();
		goto out;
	}
	for (; got < n; got++) {
		PyObject *it = PySequence_Fast_GET_ITEM(fast, got);
		int r;
		if (PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2)
			r = reg_from(PyTuple_GET_ITEM(it, 0), PyTuple_GET_ITEM(it, 1), &regs[got]);
		else
			r = reg_from(it, NULL, &regs[got]);
		if (r < 0)
			goto out;
		mr[got] = (te_memory_region){ (void *)(uintptr_t)regs[got].addr, regs[got].length, location,
					      remote ? TE_MEM_REMOTE_ACCESS : 0 };
	}
	if (pyte_enter(self) < 0)
		goto out;
	Py_BEGIN_ALLOW_THREADS
	rc = te_register_memory_batch(self->e, mr, (size_t)n);
	Py_END_ALLOW_THREADS
	if (rc == 0) {
		Py_ssize_t i;
		for (i = 0; i < n && reg_add(self, &regs[i]) == 0; i++)
			;
		if (i < n) { /* out of memory: undo all of it */
			for (Py_ssize_t k = 0; k < i; k++) {
				pyte_reg tmp;
				reg_take(self, regs[k].addr, &tmp);
			}
			Py_BEGIN_ALLOW_THREADS
			for (Py_ssize_t k = 0; k < n; k++)
				te_unregister_memory(self->e, (void *)(uintptr_t)regs[k].addr);
			Py_END_ALLOW_THREADS
			rc = -ENOMEM;
		}
	}
	pyte_leave(self);
	if (rc < 0) {
		pyte_raise_msg(rc, "register_many(%zd buffers): %s", n, te_strerror(rc));
		goto out;
	}
	out = PyList_New(n);
	for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
		PyObject *a = PyLong_FromUnsignedLongLong(regs[i].addr);
		if (a == NULL)
			Py_CLEAR(out);
		else
			PyList_SET_ITEM(out, i, a);
	}
	got = 0; /* registered: the engine holds the views now */
out:
	for (Py_ssize_t i = 0; i < got; i++)
		if (regs[i].has_view)
			PyBuffer_Release(&regs[i].view);
	PyMem_Free(regs);
	PyMem_Free(mr);
	Py_DECREF(fast);
	return out;
}

/* Waits until no batch of this engine that touches [lo, hi) has tasks in
 * flight. GIL released, sublock held exclusively (no new submits). */
static void wait_uses(PyteEngine *eo, uint64_t lo, uint64_t hi)
{
	for (;;) {
		te_batch_id busy = TE_INVALID_BATCH;
		pthread_mutex_lock(&eo->mu);
		for (pyte_use *u = eo->uses.next; u != &eo->uses && busy == TE_INVALID_BATCH; u = u->next) {
			size_t inflight = 0;
			if (u->lo < hi && lo < u->hi && te_batch_status(eo->e, u->batch, NULL, &inflight, NULL) == 0 &&
			    inflight > 0)
				busy = u->batch;
		}
		pthread_mutex_unlock(&eo->mu);
		if (busy == TE_INVALID_BATCH || atomic_load(&eo->closing))
			return;
		te_batch_wait(eo->e, busy, 100);
	}
}

static int address_of(PyObject *obj, uint64_t *addr)
{
	int64_t len;
	return pyte_local_addr(obj, addr, &len);
}

static int unregister_one(PyteEngine *eo, uint64_t addr, pyte_reg *out)
{
	int rc;

	pthread_mutex_lock(&eo->mu);
	ssize_t i = reg_find(eo, addr);
	uint64_t len = i >= 0 ? eo->regs[i].length : 0;
	pthread_mutex_unlock(&eo->mu);
	if (i < 0) {
		pyte_raise_msg(TE_ERR_ADDRESS, "unregister(%p): no buffer registered there through this engine",
			       (void *)(uintptr_t)addr);
		return -1;
	}
	Py_BEGIN_ALLOW_THREADS
	pthread_rwlock_wrlock(&eo->sublock);
	wait_uses(eo, addr, addr + len);
	rc = te_unregister_memory(eo->e, (void *)(uintptr_t)addr);
	if (rc == 0 && reg_take(eo, addr, out) < 0)
		rc = TE_ERR_ADDRESS; /* a concurrent unregister of the same buffer won */
	pthread_rwlock_unlock(&eo->sublock);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		pyte_raise_msg(rc, "unregister(%p): %s", (void *)(uintptr_t)addr, te_strerror(rc));
		return -1;
	}
	return 0;
}

static PyObject *engine_unregister(PyteEngine *self, PyObject *obj)
{
	uint64_t addr;
	pyte_reg r;

	if (address_of(obj, &addr) < 0)
		return NULL;
	if (pyte_enter(self) < 0)
		return NULL;
	int rc = unregister_one(self, addr, &r);
	pyte_leave(self);
	if (rc < 0)
		return NULL;
	if (r.has_view)
		PyBuffer_Release(&r.view);
	Py_RETURN_NONE;
}

static PyObject *engine_unregister_many(PyteEngine *self, PyObject *seq)
{
	PyObject *fast = PySequence_Fast(seq, "unregister_many() wants a sequence of buffers or addresses");
	if (fast == NULL)
		return NULL;
	for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
		PyObject *r = engine_unregister(self, PySequence_Fast_GET_ITEM(fast, i));
		if (r == NULL) {
			Py_DECREF(fast);
			return NULL;
		}
		Py_DECREF(r);
	}
	Py_DECREF(fast);
	Py_RETURN_NONE;
}

static PyObject *segment_buffer_list(te_segment_buffer *sb, int n)
{
	PyObject *list = PyList_New(n);
	for (int i = 0; list != NULL && i < n; i++) {
		PyObject *o = PyStructSequence_New(&PyteSegmentBufferType);
		PyObject *a = PyLong_FromUnsignedLongLong(sb[i].addr), *l = PyLong_FromUnsignedLongLong(sb[i].length),
			 *nm = PyUnicode_DecodeUTF8(sb[i].name, (Py_ssize_t)strnlen(sb[i].name, sizeof sb[i].name),
						    "replace");
		if (o == NULL || a == NULL || l == NULL || nm == NULL) {
			Py_XDECREF(o);
			Py_XDECREF(a);
			Py_XDECREF(l);
			Py_XDECREF(nm);
			Py_CLEAR(list);
			break;
		}
		PyStructSequence_SET_ITEM(o, 0, a);
		PyStructSequence_SET_ITEM(o, 1, l);
		PyStructSequence_SET_ITEM(o, 2, nm);
		PyList_SET_ITEM(list, i, o);
	}
	return list;
}

/* te_segment_buffers into a list; engine entered by the caller. */
static PyObject *buffers_of(PyteEngine *eo, te_segment_id id)
{
	te_segment_buffer stack[16], *sb = stack;
	int n = te_segment_buffers(eo->e, id, sb, 16);
	while (n > 16 && sb == stack) { /* more than fit: ask again with room (it may grow meanwhile) */
		int cap = n + 16;
		sb = PyMem_Calloc((size_t)cap, sizeof *sb);
		if (sb == NULL)
			return PyErr_NoMemory();
		n = te_segment_buffers(eo->e, id, sb, (size_t)cap);
		if (n > cap) {
			PyMem_Free(sb);
			sb = stack;
			n = te_segment_buffers(eo->e, id, sb, 16);
		}
	}
	PyObject *r = n < 0 ? pyte_raise_msg(n, "buffers of segment %d: %s", id, te_strerror(n)) : segment_buffer_list(sb, n);
	if (sb != stack)
		PyMem_Free(sb);
	return r;
}

static PyObject *engine_local_buffers(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	if (pyte_enter(self) < 0)
		return NULL;
	PyObject *r = buffers_of(self, TE_LOCAL_SEGMENT);
	pyte_leave(self);
	return r;
}

static PyObject *descriptor_of(PyteEngine *eo, te_segment_id id)
{
	char *json = NULL;
	int rc = te_segment_descriptor(eo->e, id, &json);
	if (rc < 0)
		return pyte_raise_msg(rc, "descriptor of segment %d: %s", id, te_strerror(rc));
	PyObject *r = PyUnicode_DecodeUTF8(json, (Py_ssize_t)strlen(json), "replace");
	te_free(json);
	return r;
}

static PyObject *engine_descriptor(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	if (pyte_enter(self) < 0)
		return NULL;
	PyObject *r = descriptor_of(self, TE_LOCAL_SEGMENT);
	pyte_leave(self);
	return r;
}

/* ------------------------------------------------------------ metrics */

/* te_engine_stats_json() as a dict. The text is libte's own rendering of
 * its counters, not a peer's, so it goes to json.loads() as it is. */
static PyObject *engine_stats(PyteEngine *self, PyObject *unused)
{
	char *json = NULL;
	int rc;

	(void)unused;
	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_engine_stats_json(self->e, &json);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise_msg(rc, "stats(): %s", te_strerror(rc));
	PyObject *text = PyUnicode_DecodeUTF8(json, (Py_ssize_t)strlen(json), "replace");
	te_free(json);
	if (text == NULL)
		return NULL;
	PyObject *mod = PyImport_ImportModule("json");
	PyObject *r = mod != NULL ? PyObject_CallMethod(mod, "loads", "O", text) : NULL;
	Py_XDECREF(mod);
	Py_DECREF(text);
	return r;
}

static PyObject *engine_metrics_text(PyteEngine *self, PyObject *unused)
{
	char *text = NULL;
	size_t len = 0;
	int rc;

	(void)unused;
	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_metrics_text(self->e, &text, &len);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise_msg(rc, "metrics_text(): %s", te_strerror(rc));
	if (len > (size_t)PY_SSIZE_T_MAX) {
		te_free(text);
		return pyte_raise_msg(-EOVERFLOW, "metrics_text(): %zu bytes", len);
	}
	PyObject *r = PyUnicode_DecodeUTF8(text != NULL ? text : "", text != NULL ? (Py_ssize_t)len : 0,
					   "replace");
	te_free(text);
	return r;
}

/* ------------------------------------------------ local byte access */

/* The registration (of this engine, in host memory) that holds
 * [addr, addr+len) whole; mu held. */
static int local_range_ok(PyteEngine *eo, uint64_t addr, uint64_t len)
{
	if (addr + len < addr)
		return 0;
	for (size_t i = 0; i < eo->nregs; i++) {
		const pyte_reg *r = &eo->regs[i];
		if (addr >= r->addr && addr + len <= r->addr + r->length)
			return 1;
	}
	return 0;
}

/* Host memory only: device memory registered raw cannot be touched by the CPU. */
static int host_location(PyteEngine *eo, uint64_t addr)
{
	te_segment_buffer sb[64];
	int n = te_segment_buffers(eo->e, TE_LOCAL_SEGMENT, sb, 64);
	for (int i = 0; i < n && i < 64; i++)
		if (addr >= sb[i].addr && addr - sb[i].addr < sb[i].length)
			return strncmp(sb[i].name, "cuda", 4) != 0;
	return n > 64; /* more regions than looked at: the table check stands */
}

/* Copies between Python bytes and memory registered with this engine, the
 * range checked against the registrations first, so a wrong address is an
 * error and never a crash. Unregistering waits for a copy in progress. */
static PyObject *engine_write_bytes(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "address", "data", NULL };
	unsigned long long addr;
	Py_buffer data;
	int ok;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Ky*:write_bytes", kwlist, &addr, &data))
		return NULL;
	if (pyte_enter(self) < 0) {
		PyBuffer_Release(&data);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	pthread_rwlock_rdlock(&self->sublock);
	pthread_mutex_lock(&self->mu);
	ok = local_range_ok(self, addr, (uint64_t)data.len);
	pthread_mutex_unlock(&self->mu);
	ok = ok && host_location(self, addr);
	if (ok && data.len > 0)
		memmove((void *)(uintptr_t)addr, data.buf, (size_t)data.len);
	pthread_rwlock_unlock(&self->sublock);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	PyBuffer_Release(&data);
	if (!ok)
		return pyte_raise_msg(TE_ERR_ADDRESS, "write_bytes(%p, %zd bytes): not inside host memory registered with this engine",
				      (void *)(uintptr_t)addr, data.len);
	Py_RETURN_NONE;
}

static PyObject *engine_read_bytes(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "address", "length", NULL };
	unsigned long long addr;
	Py_ssize_t len;
	int ok;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Kn:read_bytes", kwlist, &addr, &len))
		return NULL;
	if (len < 0) {
		PyErr_SetString(PyExc_ValueError, "read_bytes(): length must be >= 0");
		return NULL;
	}
	PyObject *out = PyBytes_FromStringAndSize(NULL, len);
	if (out == NULL)
		return NULL;
	char *dst = PyBytes_AS_STRING(out);
	if (pyte_enter(self) < 0) {
		Py_DECREF(out);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	pthread_rwlock_rdlock(&self->sublock);
	pthread_mutex_lock(&self->mu);
	ok = local_range_ok(self, addr, (uint64_t)len);
	pthread_mutex_unlock(&self->mu);
	ok = ok && host_location(self, addr);
	if (ok && len > 0)
		memcpy(dst, (const void *)(uintptr_t)addr, (size_t)len);
	pthread_rwlock_unlock(&self->sublock);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (!ok) {
		Py_DECREF(out);
		return pyte_raise_msg(TE_ERR_ADDRESS, "read_bytes(%p, %zd bytes): not inside host memory registered with this engine",
				      (void *)(uintptr_t)addr, len);
	}
	return out;
}

/* ------------------------------------------------------------ segments */

static PyObject *engine_open_segment(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "transport", NULL };
	PyObject *name_o;
	const char *transport = NULL;
	te_segment_id id;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "U|z:open_segment", kwlist, &name_o, &transport))
		return NULL;
	const char *name = PyUnicode_AsUTF8(name_o);
	if (name == NULL)
		return NULL;
	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	id = transport ? te_segment_open_with(self->e, name, transport) : te_segment_open(self->e, name);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (id < 0)
		return pyte_raise_msg(id, "open_segment('%s'): %s", name, te_strerror(id));
	return pyte_segment_new(self, id, name_o);
}

static PyObject *engine_probe(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "timeout", NULL };
	const char *name;
	PyObject *timeout_o = Py_None;
	double t;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O:probe", kwlist, &name, &timeout_o) ||
	    pyte_timeout(timeout_o, &t) < 0)
		return NULL;
	if (pyte_enter(self) < 0)
		return NULL;
	int ms = t < 0 ? 0 : t * 1000 < 1 ? 1 : (int)(t * 1000);
	Py_BEGIN_ALLOW_THREADS
	rc = te_segment_probe(self->e, name, ms);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise_msg(rc, "probe('%s'): %s", name, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *engine_refresh_segments(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	int rc;
	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_segment_refresh_all(self->e);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise(rc, "refresh_segments()");
	return PyLong_FromLong(rc);
}

/* ------------------------------------------------------- notifications */

static PyObject *engine_notify(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "segment", "msg", "sender", NULL };
	PyObject *seg_o;
	const char *msg, *sender = NULL;
	te_segment_id seg;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|$z:notify", kwlist, &seg_o, &msg, &sender) ||
	    pyte_segment_id(seg_o, &seg) < 0)
		return NULL;
	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_notify_send_as(self->e, seg, sender, msg);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise(rc, "notify()");
	Py_RETURN_NONE;
}

static PyObject *engine_notifications(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	te_notification *list = NULL;
	size_t n = 0;

	if (pyte_enter(self) < 0)
		return NULL;
	int rc = te_notify_fetch(self->e, &list, &n);
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise(rc, "notifications()");
	PyObject *out = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; out != NULL && i < n; i++) {
		PyObject *o = PyStructSequence_New(&PyteNotificationType);
		PyObject *a = PyUnicode_DecodeUTF8(list[i].name, (Py_ssize_t)strlen(list[i].name), "replace");
		PyObject *b = PyUnicode_DecodeUTF8(list[i].msg, (Py_ssize_t)strlen(list[i].msg), "replace");
		if (o == NULL || a == NULL || b == NULL) {
			Py_XDECREF(o);
			Py_XDECREF(a);
			Py_XDECREF(b);
			Py_CLEAR(out);
			break;
		}
		PyStructSequence_SET_ITEM(o, 0, a);
		PyStructSequence_SET_ITEM(o, 1, b);
		PyList_SET_ITEM(out, (Py_ssize_t)i, o);
	}
	te_notifications_free(list, n);
	return out;
}

/* -------------------------------------------------------------- batches */

static PyObject *engine_batch(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "capacity", NULL };
	Py_ssize_t cap;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "n:batch", kwlist, &cap))
		return NULL;
	if (cap <= 0) {
		PyErr_Format(PyExc_ValueError, "batch(capacity=%zd): capacity must be positive", cap);
		return NULL;
	}
	return pyte_batch_new(self, (size_t)cap);
}

static PyObject *engine_repr(PyteEngine *self)
{
	if (self->e == NULL)
		return PyUnicode_FromString("<libte.Engine closed>");
	return PyUnicode_FromFormat("<libte.Engine %s>", te_engine_name(self->e));
}

static PyMethodDef engine_methods[] = {
	{ "close", (PyCFunction)engine_close, METH_NOARGS,
	  "close()\n--\n\nCancels this engine's batches, waits for calls in other threads to return,\n"
	  "removes what the engine published and releases the buffers it held registered.\n"
	  "Idempotent; also done when the engine is collected or leaves a `with` block." },
	{ "__enter__", (PyCFunction)engine_enter_ctx, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)engine_exit_ctx, METH_VARARGS, NULL },
	{ "install", (PyCFunction)(void (*)(void))engine_install, METH_VARARGS | METH_KEYWORDS,
	  "install(name, args=None)\n--\n\nInstalls transport `name` (\"tcp\", \"rdma\", \"nvmeof\", ...) with optional\n"
	  "JSON arguments (RDMA: a NIC priority matrix or {\"devices\": [...]})." },
	{ "uninstall", (PyCFunction)engine_uninstall, METH_O, "uninstall(name)\n--\n\nUninstalls a transport." },
	{ "install_auto", (PyCFunction)engine_install_auto, METH_NOARGS,
	  "install_auto()\n--\n\nInstalls the best transport found here (RDMA with devices, else TCP); returns its name." },
	{ "register", (PyCFunction)(void (*)(void))engine_register, METH_VARARGS | METH_KEYWORDS,
	  "register(buffer, length=None, *, location='*', remote=True)\n--\n\n"
	  "Registers memory and returns its address. `buffer` is a writable object with the\n"
	  "buffer protocol (bytearray, memoryview, mmap, numpy array, libte.Memory), held\n"
	  "until unregistered so it cannot be freed or resized meanwhile; or an int address\n"
	  "with `length` (a tensor's data_ptr(): keeping that memory alive is then yours).\n"
	  "`remote`: peers may read and write it. `location`: \"cpu:N\", \"cuda:N\" or \"*\"." },
	{ "register_many", (PyCFunction)(void (*)(void))engine_register_many, METH_VARARGS | METH_KEYWORDS,
	  "register_many(buffers, *, location='*', remote=True)\n--\n\n"
	  "Registers several buffers (objects, or (address, length) pairs) at once, all or\n"
	  "nothing, publishing once. Returns their addresses." },
	{ "unregister", (PyCFunction)engine_unregister, METH_O,
	  "unregister(buffer)\n--\n\nUnregisters the memory registered at `buffer` (the object or its address).\n"
	  "Waits for this engine's batches that read or write it, and for peers' requests on it." },
	{ "unregister_many", (PyCFunction)engine_unregister_many, METH_O,
	  "unregister_many(buffers)\n--\n\nunregister() for each." },
	{ "local_buffers", (PyCFunction)engine_local_buffers, METH_NOARGS,
	  "local_buffers()\n--\n\nThe registered regions, as SegmentBuffer, sorted by address." },
	{ "write_bytes", (PyCFunction)(void (*)(void))engine_write_bytes, METH_VARARGS | METH_KEYWORDS,
	  "write_bytes(address, data)\n--\n\nCopies `data` into memory registered with this engine at `address`\n"
	  "(an AddressError, never a crash, when the range is not inside one registration)." },
	{ "read_bytes", (PyCFunction)(void (*)(void))engine_read_bytes, METH_VARARGS | METH_KEYWORDS,
	  "read_bytes(address, length)\n--\n\nA bytes copy of registered memory at `address`." },
	{ "descriptor", (PyCFunction)engine_descriptor, METH_NOARGS,
	  "descriptor()\n--\n\nThis engine's segment descriptor (JSON) as last published." },
	{ "stats", (PyCFunction)engine_stats, METH_NOARGS,
	  "stats()\n--\n\nEvery counter of the engine as plain data (a dict): per transport and operation\n"
	  "(\"transports\": requests, bytes, completed, failed, in flight, latency histogram),\n"
	  "per peer, per device, notifications, memory, RPC (docs/metrics.md). NotSupportedError\n"
	  "when counting is off (TE_METRICS=0)." },
	{ "metrics_text", (PyCFunction)engine_metrics_text, METH_NOARGS,
	  "metrics_text()\n--\n\nThe same counters in the Prometheus text format (a str)." },
	{ "open_segment", (PyCFunction)(void (*)(void))engine_open_segment, METH_VARARGS | METH_KEYWORDS,
	  "open_segment(name, transport=None)\n--\n\nOpens another engine's segment (\"host:port\" with P2PHANDSHAKE, or\n"
	  "its name in the store). `transport` forces one. Returns a Segment." },
	{ "probe", (PyCFunction)(void (*)(void))engine_probe, METH_VARARGS | METH_KEYWORDS,
	  "probe(name, timeout=None)\n--\n\nAsks the engine `name` whether it is there; raises when it does not answer." },
	{ "refresh_segments", (PyCFunction)engine_refresh_segments, METH_NOARGS,
	  "refresh_segments()\n--\n\nFetches every open segment's descriptor again; returns how many." },
	{ "notify", (PyCFunction)(void (*)(void))engine_notify, METH_VARARGS | METH_KEYWORDS,
	  "notify(segment, msg, *, sender=None)\n--\n\nSends a short text to the segment's owner and waits for its\n"
	  "acknowledgement. `sender` replaces this engine's name as the sender's." },
	{ "notifications", (PyCFunction)engine_notifications, METH_NOARGS,
	  "notifications()\n--\n\nTakes the notifications received so far (a list of Notification)." },
	{ "batch", (PyCFunction)(void (*)(void))engine_batch, METH_VARARGS | METH_KEYWORDS,
	  "batch(capacity)\n--\n\nA new Batch that holds up to `capacity` tasks over its life." },
	{ "transfer", (PyCFunction)(void (*)(void))pyte_engine_transfer, METH_VARARGS | METH_KEYWORDS,
	  "transfer(requests, *, timeout=None)\n--\n\nRuns requests ((opcode, segment, local, remote, length) tuples or\n"
	  "Request) as one batch and waits; raises TransferError if any did not complete." },
	{ "read", (PyCFunction)(void (*)(void))pyte_engine_read, METH_VARARGS | METH_KEYWORDS,
	  "read(segment, local, remote, length=None, *, timeout=None)\n--\n\n"
	  "Reads `length` bytes at `remote` in the segment into `local` (a registered buffer\n"
	  "or an address inside one) and waits. `length` defaults to the buffer's length." },
	{ "write", (PyCFunction)(void (*)(void))pyte_engine_write, METH_VARARGS | METH_KEYWORDS,
	  "write(segment, local, remote, length=None, *, timeout=None)\n--\n\nThe other direction of read()." },
	{ "read_many", (PyCFunction)(void (*)(void))pyte_engine_read_many, METH_VARARGS | METH_KEYWORDS,
	  "read_many(segment, locals, remotes, lengths, *, timeout=None)\n--\n\n"
	  "Many reads as one batch: sequences of local addresses (or buffers), remote addresses\n"
	  "and lengths (or one length for all); arrays of uint64 work too. Waits." },
	{ "write_many", (PyCFunction)(void (*)(void))pyte_engine_write_many, METH_VARARGS | METH_KEYWORDS,
	  "write_many(segment, locals, remotes, lengths, *, timeout=None)\n--\n\nThe other direction of read_many()." },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef engine_getset[] = {
	{ "name", (getter)engine_get_name, NULL, "The engine's segment name (\"host:port\" with P2PHANDSHAKE).", NULL },
	{ "address", (getter)engine_get_address, NULL, "The address peers reach this engine at.", NULL },
	{ "rpc_port", (getter)engine_get_rpc_port, NULL, "The RPC/handshake port.", NULL },
	{ "transports", (getter)engine_get_transports, NULL, "Names of the installed transports.", NULL },
	{ "closed", (getter)engine_get_closed, NULL, "True once close() began.", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject PyteEngineType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "libte.Engine",
	.tp_basicsize = sizeof(PyteEngine),
	.tp_dealloc = (destructor)engine_dealloc,
	.tp_repr = (reprfunc)engine_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Engine(metadata='P2PHANDSHAKE', name=None, *, transports=None, auto_discovery=False,\n"
		  "       rpc_port=None, address=None, options=None)\n--\n\n"
		  "A libte engine: joins a cluster through `metadata` (\"P2PHANDSHAKE\", \"etcd://h:p\",\n"
		  "\"redis://h:p\", \"http://h:p/path\") under the segment name `name`, installs\n"
		  "`transports` (\"tcp\", [\"tcp\", \"rdma\"]) or, with auto_discovery, the best one found.\n"
		  "`options`: further engine options (e.g. {\"TE_TCP_CONNS_PER_PEER\": \"4\"}).\n"
		  "A context manager: leaving the block closes it.",
	.tp_weaklistoffset = offsetof(PyteEngine, weakreflist),
	.tp_methods = engine_methods,
	.tp_getset = engine_getset,
	.tp_new = engine_new,
};

/* ------------------------------------------------------------- Segment */

typedef struct {
	PyObject_HEAD
	PyteEngine *engine;
	te_segment_id id;
	PyObject *name;
	int closed;
} PyteSegment;

PyObject *pyte_segment_new(PyteEngine *eo, te_segment_id id, PyObject *name)
{
	PyteSegment *s = PyObject_New(PyteSegment, &PyteSegmentType);
	if (s == NULL) {
		if (pyte_enter(eo) == 0) {
			te_segment_close(eo->e, id);
			pyte_leave(eo);
		}
		return NULL;
	}
	s->engine = (PyteEngine *)Py_NewRef((PyObject *)eo);
	s->id = id;
	s->name = Py_NewRef(name);
	s->closed = 0;
	return (PyObject *)s;
}

int pyte_segment_id(PyObject *o, te_segment_id *out)
{
	if (Py_IS_TYPE(o, &PyteSegmentType)) {
		PyteSegment *s = (PyteSegment *)o;
		if (s->closed) {
			pyte_raise_msg(TE_ERR_SEGMENT, "segment %U is closed", s->name);
			return -1;
		}
		*out = s->id;
		return 0;
	}
	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "a segment is a Segment or an int id, not %.100s", Py_TYPE(o)->tp_name);
		return -1;
	}
	long v = PyLong_AsLong(o);
	if (v == -1 && PyErr_Occurred())
		return -1;
	if (v < 0 || v > INT32_MAX) {
		PyErr_Format(PyExc_ValueError, "segment id %ld is out of range", v);
		return -1;
	}
	*out = (te_segment_id)v;
	return 0;
}

static void segment_close_quiet(PyteSegment *s)
{
	if (s->closed)
		return;
	s->closed = 1;
	if (try_enter(s->engine) == 0) {
		te_segment_close(s->engine->e, s->id);
		pyte_leave(s->engine);
	}
}

static void segment_dealloc(PyteSegment *s)
{
	segment_close_quiet(s);
	Py_XDECREF(s->engine);
	Py_XDECREF(s->name);
	PyObject_Free(s);
}

static PyObject *segment_close(PyteSegment *s, PyObject *unused)
{
	(void)unused;
	segment_close_quiet(s);
	Py_RETURN_NONE;
}

static PyObject *segment_enter(PyObject *s, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(s);
}

static PyObject *segment_exit(PyteSegment *s, PyObject *args)
{
	(void)args;
	segment_close_quiet(s);
	Py_RETURN_FALSE;
}

static int segment_ready(PyteSegment *s)
{
	if (s->closed) {
		pyte_raise_msg(TE_ERR_SEGMENT, "segment %U is closed", s->name);
		return -1;
	}
	return pyte_enter(s->engine);
}

static PyObject *segment_refresh(PyteSegment *s, PyObject *unused)
{
	(void)unused;
	int rc;
	if (segment_ready(s) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = te_segment_refresh(s->engine->e, s->id);
	Py_END_ALLOW_THREADS
	pyte_leave(s->engine);
	if (rc < 0)
		return pyte_raise_msg(rc, "Segment(%U).refresh(): %s", s->name, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *segment_buffers(PyteSegment *s, PyObject *unused)
{
	(void)unused;
	if (segment_ready(s) < 0)
		return NULL;
	PyObject *r = buffers_of(s->engine, s->id);
	pyte_leave(s->engine);
	return r;
}

static PyObject *segment_descriptor(PyteSegment *s, PyObject *unused)
{
	(void)unused;
	if (segment_ready(s) < 0)
		return NULL;
	PyObject *r = descriptor_of(s->engine, s->id);
	pyte_leave(s->engine);
	return r;
}

static PyObject *segment_index(PyteSegment *s)
{
	return PyLong_FromLong(s->id);
}

static PyObject *segment_repr(PyteSegment *s)
{
	return PyUnicode_FromFormat("<libte.Segment %U id %d%s>", s->name, s->id, s->closed ? " closed" : "");
}

static PyObject *segment_get_id(PyteSegment *s, void *c)
{
	(void)c;
	return PyLong_FromLong(s->id);
}

static PyObject *segment_get_name(PyteSegment *s, void *c)
{
	(void)c;
	return Py_NewRef(s->name);
}

static PyObject *segment_get_closed(PyteSegment *s, void *c)
{
	(void)c;
	return PyBool_FromLong(s->closed);
}

static PyObject *segment_get_transport(PyteSegment *s, void *c)
{
	(void)c;
	if (segment_ready(s) < 0)
		return NULL;
	const char *t = te_segment_transport(s->engine->e, s->id);
	pyte_leave(s->engine);
	if (t == NULL)
		return pyte_raise_msg(TE_ERR_SEGMENT, "segment %U has no transport", s->name);
	return PyUnicode_FromString(t);
}

static PyObject *segment_get_engine(PyteSegment *s, void *c)
{
	(void)c;
	return Py_NewRef((PyObject *)s->engine);
}

static PyNumberMethods segment_as_number = {
	.nb_int = (unaryfunc)segment_index,
	.nb_index = (unaryfunc)segment_index,
};

static PyMethodDef segment_methods[] = {
	{ "close", (PyCFunction)segment_close, METH_NOARGS,
	  "close()\n--\n\nReleases this handle's open of the segment (also on collection)." },
	{ "refresh", (PyCFunction)segment_refresh, METH_NOARGS,
	  "refresh()\n--\n\nFetches the segment's descriptor again." },
	{ "buffers", (PyCFunction)segment_buffers, METH_NOARGS,
	  "buffers()\n--\n\nThe segment's buffers as its descriptor lists them (SegmentBuffer, by address)." },
	{ "descriptor", (PyCFunction)segment_descriptor, METH_NOARGS,
	  "descriptor()\n--\n\nThe segment's descriptor (JSON) as last fetched." },
	{ "__enter__", segment_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)segment_exit, METH_VARARGS, NULL },
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef segment_getset[] = {
	{ "id", (getter)segment_get_id, NULL, "The segment id (what requests carry).", NULL },
	{ "name", (getter)segment_get_name, NULL, "The segment name.", NULL },
	{ "closed", (getter)segment_get_closed, NULL, "True after close().", NULL },
	{ "engine", (getter)segment_get_engine, NULL, "The engine that opened it.", NULL },
	{ "transport", (getter)segment_get_transport, NULL,
	  "The transport serving it (\"shm\" for an engine on this host, \"tcp\", ...).", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject PyteSegmentType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "libte.Segment",
	.tp_basicsize = sizeof(PyteSegment),
	.tp_dealloc = (destructor)segment_dealloc,
	.tp_repr = (reprfunc)segment_repr,
	.tp_as_number = &segment_as_number,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "An open segment of another engine (from Engine.open_segment). Usable wherever a\n"
		  "segment id is (int(segment) is the id). A context manager: leaving the block closes it.",
	.tp_methods = segment_methods,
	.tp_getset = segment_getset,
};
