/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte.Engine: creation and close, transports, statistics, segments,
 * notifications and batches; its registered memory is in memory.c, the
 * Segment type in segment.c.
 *
 * Thread safety: te.h calls are thread-safe, and every call that can block
 * runs with the GIL released, so Python threads transfer in parallel. The
 * one thing libte forbids is using an engine while it is destroyed: calls
 * count themselves in `active`, and close() waits until that drops to zero
 * (after canceling this engine's batches, so waiting calls end soon).
 */
#include "pyte.h"

#include <math.h>

#include <errno.h>
#include <stdbool.h>
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
int pyte_try_enter(PyteEngine *eo)
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

void pyte_use_widen(PyteEngine *eo, pyte_use *u, uint64_t lo, uint64_t hi)
{
	pthread_mutex_lock(&eo->mu);
	if (lo < u->lo)
		u->lo = lo;
	if (hi > u->hi)
		u->hi = hi;
	pthread_mutex_unlock(&eo->mu);
}

static int wait_slices(PyteEngine *eo, te_batch_id id, double timeout_s, PyThreadState **save, int settled)
{
	/* Slices short enough that Ctrl-C and close() are noticed quickly; a
	 * batch that finishes within one slice costs one wait, as without them. */
	const int slice_ms = 100;
	double left_ms = timeout_s < 0 ? -1 : timeout_s * 1000.0;

	for (;;) {
		/* Rounded up: a fraction of a millisecond left (0.1 + 0.05 s is
		 * not 150 ms in binary) is one more wait, not a zero-length one. */
		int ms = left_ms < 0 || left_ms > slice_ms ? slice_ms : (int)ceil(left_ms);
		int rc = settled ? te_batch_wait_settled(eo->e, id, ms) : te_batch_wait(eo->e, id, ms);
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

int pyte_wait(PyteEngine *eo, te_batch_id id, double timeout_s, PyThreadState **save)
{
	return wait_slices(eo, id, timeout_s, save, 0);
}

int pyte_wait_settled(PyteEngine *eo, te_batch_id id, double timeout_s, PyThreadState **save)
{
	return wait_slices(eo, id, timeout_s, save, 1);
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
		/* Waiting calls wake within a slice (pyte_wait); a canceled
		 * batch's tasks end at once on transports that honour
		 * deadlines, at their next slice boundary on others. */
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

/* ------------------------------------------------------------- getters */

static PyObject *engine_get_closed(PyteEngine *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->e == NULL || atomic_load(&self->closing));
}

static PyObject *transport_names(te_engine *e)
{
	const char *names[32];
	int n = te_transport_list(e, names, 32);
	PyObject *list = PyList_New(0);
	for (int i = 0; list != NULL && i < n && i < 32; i++) {
		PyObject *s = PyUnicode_FromString(names[i]);
		if (s == NULL || PyList_Append(list, s) < 0)
			Py_CLEAR(list);
		Py_XDECREF(s);
	}
	return list;
}

/* The getters that read the live engine; the closure says which. */
enum engine_attr { ATTR_NAME, ATTR_ADDRESS, ATTR_RPC_PORT, ATTR_TRANSPORTS };

static PyObject *engine_get_attr(PyteEngine *self, void *which)
{
	PyObject *r;

	if (pyte_enter(self) < 0)
		return NULL;
	switch ((enum engine_attr)(intptr_t)which) {
	case ATTR_NAME: r = PyUnicode_FromString(te_engine_name(self->e)); break;
	case ATTR_ADDRESS: r = PyUnicode_FromString(te_engine_address(self->e)); break;
	case ATTR_RPC_PORT: r = PyLong_FromLong(te_engine_rpc_port(self->e)); break;
	default: r = transport_names(self->e); break;
	}
	pyte_leave(self);
	return r;
}

/* ---------------------------------------------------------- transports */

/* The methods that make one libte call on a name: install(name, args=None),
 * uninstall(name) and probe(name, timeout=None) (`json` and `ms` are the
 * arguments of the first and the last). */
enum name_call { CALL_INSTALL, CALL_UNINSTALL, CALL_PROBE };

static PyObject *name_call(PyteEngine *self, enum name_call call, const char *name, const char *json, int ms)
{
	static const char *const what[] = { "install", "uninstall", "probe" };
	int rc;

	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	switch (call) {
	case CALL_INSTALL: rc = te_transport_install(self->e, name, json); break;
	case CALL_UNINSTALL: rc = te_transport_uninstall(self->e, name); break;
	default: rc = te_segment_probe(self->e, name, ms); break;
	}
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise_msg(rc, "%s('%s'): %s", what[call], name, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *engine_install(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "args", NULL };
	const char *name, *json = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|z:install", kwlist, &name, &json))
		return NULL;
	return name_call(self, CALL_INSTALL, name, json, 0);
}

static PyObject *engine_uninstall(PyteEngine *self, PyObject *arg)
{
	const char *name = PyUnicode_AsUTF8(arg);
	return name == NULL ? NULL : name_call(self, CALL_UNINSTALL, name, NULL, 0);
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

/* ------------------------------------------------------------ metrics */

/* The engine's counters as libte renders them: stats() takes
 * te_engine_stats_json() to a dict, metrics_text() returns te_metrics_text()
 * as a str. The JSON is libte's own, not a peer's, so it goes to
 * json.loads() as it is. */
static PyObject *engine_counters(PyteEngine *self, bool json)
{
	const char *what = json ? "stats()" : "metrics_text()";
	char *text = NULL;
	size_t len = 0;
	int rc;

	if (pyte_enter(self) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = json ? te_engine_stats_json(self->e, &text) : te_metrics_text(self->e, &text, &len);
	Py_END_ALLOW_THREADS
	pyte_leave(self);
	if (rc < 0)
		return pyte_raise(rc, what);
	if (json && text != NULL)
		len = strlen(text);
	if (len > (size_t)PY_SSIZE_T_MAX) {
		te_free(text);
		return pyte_raise_msg(-EOVERFLOW, "%s: %zu bytes", what, len);
	}
	PyObject *r = PyUnicode_DecodeUTF8(text != NULL ? text : "", text != NULL ? (Py_ssize_t)len : 0, "replace");
	te_free(text);
	if (r == NULL || !json)
		return r;
	PyObject *mod = PyImport_ImportModule("json");
	PyObject *d = mod != NULL ? PyObject_CallMethod(mod, "loads", "O", r) : NULL;
	Py_XDECREF(mod);
	Py_DECREF(r);
	return d;
}

static PyObject *engine_stats(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	return engine_counters(self, true);
}

static PyObject *engine_metrics_text(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	return engine_counters(self, false);
}

/* ------------------------------------------------------------ segments */

static PyObject *engine_open_segment(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "transport", NULL };
	PyObject *name_o;
	const char *transport = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "U|z:open_segment", kwlist, &name_o, &transport))
		return NULL;
	return pyte_segment_open(self, name_o, transport);
}

static PyObject *engine_probe(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "name", "timeout", NULL };
	const char *name;
	double t = -1;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O&:probe", kwlist, &name, pyte_timeout_arg, &t))
		return NULL;
	return name_call(self, CALL_PROBE, name, NULL, t < 0 ? 0 : t * 1000 < 1 ? 1 : (int)(t * 1000));
}

static PyObject *engine_refresh_segments(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	return pyte_segment_refresh(self, -1, NULL);
}

/* ------------------------------------------------------- notifications */

PyObject *pyte_notify(PyteEngine *eo, te_batch_id batch, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "segment", "msg", "sender", NULL };
	const char *msg, *sender = NULL;
	te_segment_id seg;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&s|$z:notify", kwlist, pyte_segment_arg, &seg, &msg, &sender))
		return NULL;
	if (pyte_enter(eo) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = batch == TE_INVALID_BATCH ? te_notify_send_as(eo->e, seg, sender, msg)
				       : te_batch_notify_as(eo->e, batch, seg, sender, msg);
	Py_END_ALLOW_THREADS
	pyte_leave(eo);
	if (rc < 0)
		return pyte_raise(rc, batch == TE_INVALID_BATCH ? "notify()" : "Batch.notify()");
	Py_RETURN_NONE;
}

static PyObject *engine_notify(PyteEngine *self, PyObject *args, PyObject *kw)
{
	return pyte_notify(self, TE_INVALID_BATCH, args, kw);
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
		PyObject *items[2] = {
			PyUnicode_DecodeUTF8(list[i].name, (Py_ssize_t)strlen(list[i].name), "replace"),
			PyUnicode_DecodeUTF8(list[i].msg, (Py_ssize_t)strlen(list[i].msg), "replace"),
		};
		PyObject *o = pyte_struct_seq(&PyteNotificationType, items, 2);
		if (o == NULL)
			Py_CLEAR(out);
		else
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
	if (!PyArg_ParseTupleAndKeywords(args, kw, "n:batch", kwlist, &cap) ||
	    pyte_positive_arg("batch", "capacity", cap) < 0)
		return NULL;
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
	{ "__exit__", pyte_exit_close, METH_VARARGS, NULL },
	PYTE_KW_METHOD("install", engine_install,
	  "install(name, args=None)\n--\n\nInstalls transport `name` (\"tcp\", \"rdma\", \"nvmeof\", ...) with optional\n"
	  "JSON arguments (RDMA: a NIC priority matrix or {\"devices\": [...]})."),
	{ "uninstall", (PyCFunction)engine_uninstall, METH_O, "uninstall(name)\n--\n\nUninstalls a transport." },
	{ "install_auto", (PyCFunction)engine_install_auto, METH_NOARGS,
	  "install_auto()\n--\n\nInstalls the best transport found here (RDMA with devices, else TCP); returns its name." },
	PYTE_KW_METHOD("register", pyte_engine_register,
	  "register(buffer, length=None, *, location='*', remote=True)\n--\n\n"
	  "Registers memory and returns its address. `buffer` is a writable object with the\n"
	  "buffer protocol (bytearray, memoryview, mmap, numpy array, libte.Memory), held\n"
	  "until unregistered so it cannot be freed or resized meanwhile; or an int address\n"
	  "with `length` (a tensor's data_ptr(): keeping that memory alive is then yours).\n"
	  "`remote`: peers may read and write it. `location`: \"cpu:N\", \"cuda:N\" or \"*\"."),
	PYTE_KW_METHOD("register_many", pyte_engine_register_many,
	  "register_many(buffers, *, location='*', remote=True)\n--\n\n"
	  "Registers several buffers (objects, or (address, length) pairs) at once, all or\n"
	  "nothing, publishing once. Returns their addresses."),
	{ "unregister", (PyCFunction)pyte_engine_unregister, METH_O,
	  "unregister(buffer)\n--\n\nUnregisters the memory registered at `buffer` (the object or its address).\n"
	  "Waits for this engine's batches that read or write it, and for peers' requests on it." },
	{ "unregister_many", (PyCFunction)pyte_engine_unregister_many, METH_O,
	  "unregister_many(buffers)\n--\n\nunregister() for each." },
	{ "local_buffers", (PyCFunction)pyte_engine_local_buffers, METH_NOARGS,
	  "local_buffers()\n--\n\nThe registered regions, as SegmentBuffer, sorted by address." },
	PYTE_KW_METHOD("write_bytes", pyte_engine_write_bytes,
	  "write_bytes(address, data)\n--\n\nCopies `data` into memory registered with this engine at `address`\n"
	  "(an AddressError, never a crash, when the range is not inside one registration)."),
	PYTE_KW_METHOD("read_bytes", pyte_engine_read_bytes,
	  "read_bytes(address, length)\n--\n\nA bytes copy of registered memory at `address`."),
	{ "descriptor", (PyCFunction)pyte_engine_descriptor, METH_NOARGS,
	  "descriptor()\n--\n\nThis engine's segment descriptor (JSON) as last published." },
	{ "stats", (PyCFunction)engine_stats, METH_NOARGS,
	  "stats()\n--\n\nEvery counter of the engine as plain data (a dict): per transport and operation\n"
	  "(\"transports\": requests, bytes, completed, failed, in flight, latency histogram),\n"
	  "per peer, per device, notifications, memory, RPC (docs/metrics.md). NotSupportedError\n"
	  "when counting is off (TE_METRICS=0)." },
	{ "metrics_text", (PyCFunction)engine_metrics_text, METH_NOARGS,
	  "metrics_text()\n--\n\nThe same counters in the Prometheus text format (a str)." },
	PYTE_KW_METHOD("open_segment", engine_open_segment,
	  "open_segment(name, transport=None)\n--\n\nOpens another engine's segment (\"host:port\" with P2PHANDSHAKE, or\n"
	  "its name in the store). `transport` forces one. Returns a Segment."),
	PYTE_KW_METHOD("probe", engine_probe,
	  "probe(name, timeout=None)\n--\n\nAsks the engine `name` whether it is there; raises when it does not answer."),
	{ "refresh_segments", (PyCFunction)engine_refresh_segments, METH_NOARGS,
	  "refresh_segments()\n--\n\nFetches every open segment's descriptor again; returns how many." },
	PYTE_KW_METHOD("notify", engine_notify,
	  "notify(segment, msg, *, sender=None)\n--\n\nSends a short text to the segment's owner and waits for its\n"
	  "acknowledgement. `sender` replaces this engine's name as the sender's."),
	{ "notifications", (PyCFunction)engine_notifications, METH_NOARGS,
	  "notifications()\n--\n\nTakes the notifications received so far (a list of Notification)." },
	PYTE_KW_METHOD("prepare", pyte_engine_prepare,
	  "prepare(segment, addrs, lengths)\n--\n\nAn XferList: pieces of `segment` (LOCAL_SEGMENT: registered memory) "
	  "at `addrs` of `lengths` (an int: all alike), checked and resolved once (te_xfer_list_prepare). "
	  "addrs and lengths: arrays of 8-byte integers or sequences of ints."),
	PYTE_KW_METHOD("batch", engine_batch,
	  "batch(capacity)\n--\n\nA new Batch that holds up to `capacity` tasks over its life."),
	PYTE_KW_METHOD("transfer", pyte_engine_transfer,
	  "transfer(requests, *, timeout=None)\n--\n\nRuns requests ((opcode, segment, local, remote, length) tuples or\n"
	  "Request) as one batch and waits; raises TransferError if any did not complete.\n"
	  "`timeout` (seconds) is the tasks' deadline: past it they end and TimeoutError is raised\n"
	  "within milliseconds, once nothing touches the local buffers any more."),
	PYTE_KW_METHOD("read", pyte_engine_read,
	  "read(segment, local, remote, length=None, *, timeout=None)\n--\n\n"
	  "Reads `length` bytes at `remote` in the segment into `local` (a registered buffer\n"
	  "or an address inside one) and waits. `length` defaults to the buffer's length.\n"
	  "`timeout` as for transfer()."),
	PYTE_KW_METHOD("write", pyte_engine_write,
	  "write(segment, local, remote, length=None, *, timeout=None)\n--\n\nThe other direction of read()."),
	PYTE_KW_METHOD("read_many", pyte_engine_read_many,
	  "read_many(segment, locals, remotes, lengths, *, timeout=None)\n--\n\n"
	  "Many reads as one batch: sequences of local addresses (or buffers), remote addresses\n"
	  "and lengths (or one length for all); arrays of uint64 work too. Waits."),
	PYTE_KW_METHOD("write_many", pyte_engine_write_many,
	  "write_many(segment, locals, remotes, lengths, *, timeout=None)\n--\n\nThe other direction of read_many()."),
	{ NULL, NULL, 0, NULL },
};

static PyGetSetDef engine_getset[] = {
	{ "name", (getter)engine_get_attr, NULL, "The engine's segment name (\"host:port\" with P2PHANDSHAKE).",
	  (void *)(intptr_t)ATTR_NAME },
	{ "address", (getter)engine_get_attr, NULL, "The address peers reach this engine at.",
	  (void *)(intptr_t)ATTR_ADDRESS },
	{ "rpc_port", (getter)engine_get_attr, NULL, "The RPC/handshake port.", (void *)(intptr_t)ATTR_RPC_PORT },
	{ "transports", (getter)engine_get_attr, NULL, "Names of the installed transports.",
	  (void *)(intptr_t)ATTR_TRANSPORTS },
	{ "closed", (getter)engine_get_closed, NULL, "True once close() began.", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject PyteEngineType = {
	PYTE_TYPE_HEAD("libte.Engine", PyteEngine, engine_dealloc, engine_repr),
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
