/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libte._native: the CPython extension behind the `libte` package. It sits on
 * te.h only. Shared between its files: module.c (errors, module functions,
 * libte.Memory), engine.c (Engine), memory.c (the Engine's registered
 * memory), segment.c (Segment), batch.c (Batch, request parsing, the
 * synchronous helpers), prepared.c (XferList, Batch.submit_prepared).
 */
#ifndef PYTE_H
#define PYTE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* PyMemberDef: T_INT, T_BOOL, READONLY */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <te/te.h>

/* ------------------------------------------------------------ errors */

/* Raises the exception class that fits `code` with "<what>: <te_strerror>"
 * and libte's last error line on this thread. Returns NULL. */
PyObject *pyte_raise(int code, const char *what);
/* The same with a message of the caller's. */
PyObject *pyte_raise_msg(int code, const char *fmt, ...);
/* The class for a code (borrowed). */
PyObject *pyte_error_class(int code);
extern PyObject *PyteError, *PyteClosedError, *PyteTransferError;
#define PYTE_CLOSED (-EBADF) /* the engine was closed: not a libte code */

/* -------------------------------------------------------- struct seqs */

extern PyTypeObject PyteTaskStatusType, PyteNotificationType, PyteSegmentBufferType,
	PytePluginInfoType, PyteTaskInfoType;
/* A new struct sequence of `type` holding items[0..n) (references it
 * takes, also when it fails); NULL with an exception when an item is NULL
 * (its exception set) or the sequence cannot be made. */
PyObject *pyte_struct_seq(PyTypeObject *type, PyObject **items, int n);
PyObject *pyte_task_status(const te_task_status *st);
PyObject *pyte_task_info(const te_task_info *ti);

/* ------------------------------------------------------------ engine */

/* A range of local memory that a batch reads or writes, so that
 * unregistering it waits for that batch first (libte pins remote ranges
 * only: the initiator's own buffers are the caller's to keep alive). */
typedef struct pyte_use {
	struct pyte_use *next, *prev;
	te_batch_id batch;
	uint64_t lo, hi; /* [lo, hi); empty when lo >= hi */
} pyte_use;

typedef struct pyte_reg {
	uint64_t addr;
	uint64_t length;
	Py_buffer view; /* holds the object's buffer while registered */
	int has_view;   /* 0: a raw address the caller answers for */
} pyte_reg;

typedef struct {
	PyObject_HEAD
	te_engine *e;
	pthread_mutex_t mu;   /* active, regs, uses */
	pthread_cond_t idle;  /* signalled when active drops to 0 while closing */
	int active;           /* calls inside libte with this engine */
	atomic_int closing;
	/* Submits hold it shared, unregister exclusive: an unregister never
	 * runs between a submit's bookkeeping and its te_submit(). */
	pthread_rwlock_t sublock;
	pyte_reg *regs;
	size_t nregs, capregs;
	pyte_use uses; /* list head */
	PyObject *weakreflist;
} PyteEngine;

extern PyTypeObject PyteEngineType, PyteSegmentType, PyteBatchType, PyteMemoryType, PyteXferListType;

/* What every type of the extension sets alike: a final (not subclassable),
 * uncollected object of C struct `type` with its own deallocator and repr. */
#define PYTE_TYPE_HEAD(name, type, dealloc, repr)                                      \
	PyVarObject_HEAD_INIT(NULL, 0)                                                 \
	.tp_name = (name), .tp_basicsize = sizeof(type), .tp_dealloc = (destructor)(dealloc), \
	.tp_repr = (reprfunc)(repr), .tp_flags = Py_TPFLAGS_DEFAULT

/* Marks a call in progress; raises ClosedError (and returns -1) when the
 * engine is closed or closing. GIL held. */
int pyte_enter(PyteEngine *eo);
void pyte_leave(PyteEngine *eo);
/* pyte_enter() for deallocators, which must not raise: -1, no exception. */
int pyte_try_enter(PyteEngine *eo);
void pyte_use_link(PyteEngine *eo, pyte_use *u);
void pyte_use_unlink(PyteEngine *eo, pyte_use *u);
/* Widens `u` to cover [lo, hi) too, before tasks that touch it exist. */
void pyte_use_widen(PyteEngine *eo, pyte_use *u, uint64_t lo, uint64_t hi);
/* Waits for a batch with the GIL released by the caller (`*save` its
 * thread state), in slices, so a closing engine or a signal ends the wait.
 * timeout_s < 0: no limit. 0, -ETIMEDOUT, PYTE_CLOSED, -EINTR (a Python
 * signal handler raised: its exception is set when the GIL is back), or a
 * libte error. */
int pyte_wait(PyteEngine *eo, te_batch_id id, double timeout_s, PyThreadState **save);
/* The same until no task is in flight nor TE_TASK_UNSETTLED either. */
int pyte_wait_settled(PyteEngine *eo, te_batch_id id, double timeout_s, PyThreadState **save);

/* Segment id from a Segment object or an int. -1 with an exception set. */
int pyte_segment_id(PyObject *o, te_segment_id *out);
/* Engine.open_segment(name, transport): a new Segment. */
PyObject *pyte_segment_open(PyteEngine *eo, PyObject *name, const char *transport);
/* Engine.notify (batch TE_INVALID_BATCH: te_notify_send_as) and
 * Batch.notify (te_batch_notify_as): (segment, msg, *, sender=None). */
PyObject *pyte_notify(PyteEngine *eo, te_batch_id batch, PyObject *args, PyObject *kw);
/* A segment's buffers (a list of SegmentBuffer) and descriptor (a str), for
 * Engine and Segment alike; they enter the engine for the call. */
PyObject *pyte_segment_buffers(PyteEngine *eo, te_segment_id id);
/* Engine.refresh_segments() (name NULL: every open segment, `id` unused;
 * returns how many) and Segment.refresh() (segment `id` named `name`;
 * returns None). */
PyObject *pyte_segment_refresh(PyteEngine *eo, te_segment_id id, PyObject *name);
PyObject *pyte_segment_descriptor(PyteEngine *eo, te_segment_id id);

/* Engine methods that live in memory.c. */
PyObject *pyte_engine_register(PyteEngine *self, PyObject *args, PyObject *kw);
PyObject *pyte_engine_register_many(PyteEngine *self, PyObject *args, PyObject *kw);
PyObject *pyte_engine_unregister(PyteEngine *self, PyObject *obj);
PyObject *pyte_engine_unregister_many(PyteEngine *self, PyObject *seq);
PyObject *pyte_engine_local_buffers(PyteEngine *self, PyObject *unused);
PyObject *pyte_engine_descriptor(PyteEngine *self, PyObject *unused);
PyObject *pyte_engine_write_bytes(PyteEngine *self, PyObject *args, PyObject *kw);
PyObject *pyte_engine_read_bytes(PyteEngine *self, PyObject *args, PyObject *kw);

/* ------------------------------------------------------------- batch */

/* Address (and, for buffer objects, length) of a local argument: an int
 * address or an object with the buffer protocol. *len is -1 for an int. */
int pyte_local_addr(PyObject *o, uint64_t *addr, int64_t *len);
PyObject *pyte_batch_new(PyteEngine *eo, size_t capacity);

/* Engine methods that live in batch.c. */
PyObject *pyte_engine_transfer(PyteEngine *eo, PyObject *args, PyObject *kw);
PyObject *pyte_engine_read(PyteEngine *eo, PyObject *args, PyObject *kw);
PyObject *pyte_engine_write(PyteEngine *eo, PyObject *args, PyObject *kw);
PyObject *pyte_engine_read_many(PyteEngine *eo, PyObject *args, PyObject *kw);
PyObject *pyte_engine_write_many(PyteEngine *eo, PyObject *args, PyObject *kw);

/* ---------------------------------------------------------- prepared.c */

/* Engine.prepare(segment, addrs, lengths) → XferList. */
PyObject *pyte_engine_prepare(PyteEngine *eo, PyObject *args, PyObject *kw);
/* The body of Batch.submit_prepared for batch `id` (entered by the
 * caller), widening `use` by the local lists' span. */
PyObject *pyte_submit_prepared(PyteEngine *eo, te_batch_id id, pyte_use *use, PyObject *args, PyObject *kw);

/* A method-table entry of a function taking (self, args, kwargs): such a
 * function reaches the table's PyCFunction through void (*)(void), the cast
 * that -Wcast-function-type lets pass. */
#define PYTE_KW_METHOD(name, fn, doc) { (name), (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS, (doc) }

/* __enter__ of the context managers that need nothing on entry: self. */
PyObject *pyte_return_self(PyObject *self, PyObject *unused);
/* __exit__ of the context managers that close on leaving: self.close(),
 * then False (an exception in the block goes on). */
PyObject *pyte_exit_close(PyObject *self, PyObject *args);
/* The two method-table entries of such a context manager. */
#define PYTE_CLOSING_CTX_METHODS                              \
	{ "__enter__", pyte_return_self, METH_NOARGS, NULL }, \
	{ "__exit__", pyte_exit_close, METH_VARARGS, NULL }

/* Converters of arguments for PyArg_Parse's "O&": 1 when converted, 0 with
 * an exception. An optional argument's variable holds its default, as a
 * converter is not called for an argument not given. */
/* Seconds (a double) from a timeout argument: None → -1 (no limit); a
 * non-negative number. */
int pyte_timeout_arg(PyObject *o, void *seconds);
/* A deadline (an int64_t) from a te_now_ns() time, an int >= 0: None → 0
 * (none, or the batch's). */
int pyte_deadline_arg(PyObject *o, void *deadline);
/* A te_segment_id from a Segment or an int id (pyte_segment_id). */
int pyte_segment_arg(PyObject *o, void *id);
/* 0 when `v`, the argument `arg` of `call`, is positive; -1 with
 * ValueError "<call>(<arg>=<v>): <arg> must be positive" otherwise. */
int pyte_positive_arg(const char *call, const char *arg, Py_ssize_t v);
/* The deadline `timeout_s` (>= 0) seconds from now. */
int64_t pyte_deadline_after(double timeout_s);

#endif
