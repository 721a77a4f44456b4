/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The memory an Engine registers: the table of its registrations (each
 * holding its Python buffer), register()/unregister() and their many forms,
 * and copies in and out of registered host memory.
 */
#include "pyte.h"

#include <errno.h>
#include <string.h>

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

PyObject *pyte_engine_register(PyteEngine *self, PyObject *args, PyObject *kw)
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

PyObject *pyte_engine_register_many(PyteEngine *self, PyObject *args, PyObject *kw)
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

PyObject *pyte_engine_unregister(PyteEngine *self, PyObject *obj)
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

PyObject *pyte_engine_unregister_many(PyteEngine *self, PyObject *seq)
{
	PyObject *fast = PySequence_Fast(seq, "unregister_many() wants a sequence of buffers or addresses");
	if (fast == NULL)
		return NULL;
	for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
		PyObject *r = pyte_engine_unregister(self, PySequence_Fast_GET_ITEM(fast, i));
		if (r == NULL) {
			Py_DECREF(fast);
			return NULL;
		}
		Py_DECREF(r);
	}
	Py_DECREF(fast);
	Py_RETURN_NONE;
}

PyObject *pyte_engine_local_buffers(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	return pyte_segment_buffers(self, TE_LOCAL_SEGMENT);
}

PyObject *pyte_engine_descriptor(PyteEngine *self, PyObject *unused)
{
	(void)unused;
	return pyte_segment_descriptor(self, TE_LOCAL_SEGMENT);
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

/* Copies `len` bytes between `buf` and memory registered with this engine
 * at `addr` (into the registration when `in`), if [addr, addr+len) lies
 * inside one registration in host memory. 1 when copied, 0 when refused.
 * GIL released; sublock held shared meanwhile, so no unregister runs. */
static int copy_registered(PyteEngine *eo, uint64_t addr, void *buf, size_t len, int in)
{
	int ok;

	pthread_rwlock_rdlock(&eo->sublock);
	pthread_mutex_lock(&eo->mu);
	ok = local_range_ok(eo, addr, len);
	pthread_mutex_unlock(&eo->mu);
	ok = ok && host_location(eo, addr);
	if (ok && len > 0) {
		if (in)
			memmove((void *)(uintptr_t)addr, buf, len);
		else
			memcpy(buf, (const void *)(uintptr_t)addr, len);
	}
	pthread_rwlock_unlock(&eo->sublock);
	return ok;
}

/* copy_registered() for a call `what`, the engine entered and the GIL
 * released around it; -1 with AddressError when the range is refused. */
static int copy_call(PyteEngine *eo, const char *what, uint64_t addr, void *buf, size_t len, int in)
{
	int ok;

	if (pyte_enter(eo) < 0)
		return -1;
	Py_BEGIN_ALLOW_THREADS
	ok = copy_registered(eo, addr, buf, len, in);
	Py_END_ALLOW_THREADS
	pyte_leave(eo);
	if (!ok) {
		pyte_raise_msg(TE_ERR_ADDRESS, "%s(%p, %zu bytes): not inside host memory registered with this engine",
			       what, (void *)(uintptr_t)addr, len);
		return -1;
	}
	return 0;
}

/* Copies between Python bytes and memory registered with this engine, the
 * range checked against the registrations first, so a wrong address is an
 * error and never a crash. Unregistering waits for a copy in progress. */
PyObject *pyte_engine_write_bytes(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "address", "data", NULL };
	unsigned long long addr;
	Py_buffer data;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Ky*:write_bytes", kwlist, &addr, &data))
		return NULL;
	int rc = copy_call(self, "write_bytes", addr, data.buf, (size_t)data.len, 1);
	PyBuffer_Release(&data);
	if (rc < 0)
		return NULL;
	Py_RETURN_NONE;
}

PyObject *pyte_engine_read_bytes(PyteEngine *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "address", "length", NULL };
	unsigned long long addr;
	Py_ssize_t len;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Kn:read_bytes", kwlist, &addr, &len))
		return NULL;
	if (len < 0) {
		PyErr_SetString(PyExc_ValueError, "read_bytes(): length must be >= 0");
		return NULL;
	}
	PyObject *out = PyBytes_FromStringAndSize(NULL, len);
	if (out != NULL && copy_call(self, "read_bytes", addr, PyBytes_AS_STRING(out), (size_t)len, 0) < 0)
		Py_CLEAR(out);
	return out;
}
