/* SPDX-License-Identifier: Apache-2.0 */
/* libte._native: exceptions, result types, module functions, libte.Memory. */
#include "pyte.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ------------------------------------------------------------ errors */

PyObject *PyteError, *PyteClosedError, *PyteTransferError;
static PyObject *InvalidArgumentError, *TimeoutErr, *BusyError, *NotFoundError, *ConnectionErr,
	*NotSupportedError, *PluginError, *NoTransportError, *MetadataError, *ProtocolError,
	*RejectedError, *BatchFullError, *AddressError, *OverlapError, *SegmentError, *BatchError,
	*AuthError;

/* The subclasses of libte.Error: each class's name, the builtin exception it
 * also derives from (or none), its doc, and the codes raised as it (a code
 * listed nowhere raises libte.Error itself). */
static const struct pyte_exc {
	const char *name;
	PyObject **builtin;
	const char *doc;
	PyObject **cls;
	int codes[8]; /* ends at the first 0 */
} exc_table[] = {
	{ "ClosedError", &PyExc_ValueError, "The engine was closed.", &PyteClosedError, { PYTE_CLOSED } },
	{ "TransferError", NULL,
	  "A transfer ended other than COMPLETED. `task` is the first such task's index,\n"
	  "`statuses` every task's TaskStatus.",
	  &PyteTransferError, { 0 } },
	{ "InvalidArgumentError", &PyExc_ValueError, "A bad argument (-EINVAL and kin).", &InvalidArgumentError,
	  { -EINVAL, -ERANGE, -EMSGSIZE, -ENAMETOOLONG, -EOVERFLOW } },
	{ "TimeoutError", &PyExc_TimeoutError, "Timed out (-ETIMEDOUT).", &TimeoutErr, { -ETIMEDOUT } },
	{ "BusyError", NULL, "Busy (-EBUSY): e.g. a batch with tasks in flight.", &BusyError, { -EBUSY } },
	{ "NotFoundError", &PyExc_LookupError, "Not found (-ENOENT).", &NotFoundError, { -ENOENT } },
	{ "ConnectionError", &PyExc_ConnectionError, "A peer could not be reached.", &ConnectionErr,
	  { -ECONNREFUSED, -ECONNRESET, -ECONNABORTED, -EHOSTUNREACH, -EHOSTDOWN, -ENETUNREACH, -ENETDOWN, -EPIPE } },
	{ "NotSupportedError", &PyExc_NotImplementedError, "Not supported here (-ENOTSUP).", &NotSupportedError,
	  { -ENOTSUP, -ENOSYS } },
	{ "PluginError", NULL, "A plugin could not be loaded or failed.", &PluginError, { TE_ERR_PLUGIN } },
	{ "NoTransportError", NULL, "No installed transport reaches the segment.", &NoTransportError,
	  { TE_ERR_NO_TRANSPORT } },
	{ "MetadataError", NULL, "The metadata store failed or holds bad data.", &MetadataError, { TE_ERR_METADATA } },
	{ "ProtocolError", NULL, "A peer broke the wire protocol.", &ProtocolError, { TE_ERR_PROTOCOL } },
	{ "RejectedError", NULL, "A peer refused the request.", &RejectedError, { TE_ERR_REJECTED } },
	{ "BatchFullError", NULL, "More requests than the batch's capacity.", &BatchFullError, { TE_ERR_BATCH_FULL } },
	{ "AddressError", NULL, "Memory not registered, or a range outside a buffer.", &AddressError,
	  { TE_ERR_ADDRESS } },
	{ "OverlapError", NULL, "A registration overlaps an existing one.", &OverlapError, { TE_ERR_OVERLAP } },
	{ "SegmentError", NULL, "Unknown or closed segment.", &SegmentError, { TE_ERR_SEGMENT } },
	{ "BatchError", NULL, "Unknown or freed batch.", &BatchError, { TE_ERR_BATCH } },
	{ "AuthError", NULL, "Peer authentication failed, or the cluster keys differ.", &AuthError, { TE_ERR_AUTH } },
};

PyObject *pyte_error_class(int code)
{
	for (size_t i = 0; i < sizeof exc_table / sizeof *exc_table; i++)
		for (int k = 0; k < 8 && exc_table[i].codes[k] != 0; k++)
			if (exc_table[i].codes[k] == code)
				return *exc_table[i].cls;
	return PyteError;
}

/* An exception instance of `cls` with .code and .detail set. */
static PyObject *make_error(PyObject *cls, int code, PyObject *msg, const char *detail)
{
	PyObject *exc = PyObject_CallOneArg(cls, msg);
	if (exc == NULL)
		return NULL;
	PyObject *c = PyLong_FromLong(code);
	PyObject *d = PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail), "replace");
	if (c == NULL || d == NULL || PyObject_SetAttrString(exc, "code", c) < 0 ||
	    PyObject_SetAttrString(exc, "detail", d) < 0) {
		Py_XDECREF(c);
		Py_XDECREF(d);
		Py_DECREF(exc);
		return NULL;
	}
	Py_DECREF(c);
	Py_DECREF(d);
	return exc;
}

static PyObject *raise_with(int code, PyObject *msg)
{
	const char *detail = code == PYTE_CLOSED ? "" : te_last_error();
	PyObject *cls = pyte_error_class(code);
	PyObject *exc;

	if (msg == NULL)
		return NULL;
	if (detail[0] != '\0') {
		PyObject *full = PyUnicode_FromFormat("%U [%s]", msg, detail);
		Py_DECREF(msg);
		if (full == NULL)
			return NULL;
		msg = full;
	}
	exc = make_error(cls, code, msg, detail);
	Py_DECREF(msg);
	if (exc != NULL) {
		PyErr_SetObject(cls, exc);
		Py_DECREF(exc);
	}
	return NULL;
}

PyObject *pyte_raise(int code, const char *what)
{
	const char *why = code == PYTE_CLOSED ? "the engine is closed" : te_strerror(code);
	return raise_with(code, PyUnicode_FromFormat("%s: %s", what, why));
}

PyObject *pyte_raise_msg(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
	va_end(ap);
	return raise_with(code, msg);
}

PyObject *pyte_return_self(PyObject *self, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(self);
}

PyObject *pyte_exit_close(PyObject *self, PyObject *args)
{
	(void)args;
	PyObject *r = PyObject_CallMethod(self, "close", NULL);
	if (r == NULL)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

int pyte_timeout_arg(PyObject *o, void *seconds)
{
	double *out = seconds;
	if (o == Py_None) {
		*out = -1;
		return 1;
	}
	double t = PyFloat_AsDouble(o);
	if (t == -1.0 && PyErr_Occurred())
		return 0;
	if (!(t >= 0) || t > 1e9) {
		PyErr_SetString(PyExc_ValueError, "timeout must be None or a number of seconds >= 0");
		return 0;
	}
	*out = t;
	return 1;
}

int pyte_deadline_arg(PyObject *o, void *deadline)
{
	int64_t *out = deadline;
	if (o == Py_None) {
		*out = 0;
		return 1;
	}
	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "deadline must be None or an int (libte.now_ns() nanoseconds), not %.100s",
			     Py_TYPE(o)->tp_name);
		return 0;
	}
	int overflow = 0;
	long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
	if (v == -1 && PyErr_Occurred())
		return 0;
	if (overflow != 0 || v < 0) {
		pyte_raise_msg(-EINVAL, "deadline %S: want libte.now_ns() nanoseconds, 0 or more and below 2**63", o);
		return 0;
	}
	*out = (int64_t)v;
	return 1;
}

int pyte_positive_arg(const char *call, const char *arg, Py_ssize_t v)
{
	if (v > 0)
		return 0;
	PyErr_Format(PyExc_ValueError, "%s(%s=%zd): %s must be positive", call, arg, v, arg);
	return -1;
}

int64_t pyte_deadline_after(double timeout_s)
{
	int64_t now = te_now_ns();
	double ns = timeout_s * 1e9; /* pyte_timeout_arg() bounds it to 1e18 */
	if (ns >= (double)(INT64_MAX - now))
		return INT64_MAX;
	return now + (int64_t)ns;
}

/* ------------------------------------------------------- result types */

static PyStructSequence_Field status_fields[] = {
	{ "state", "TaskState: WAITING 0, PENDING 1, INVALID 2, CANCELED 3, COMPLETED 4, TIMEOUT 5, FAILED 6" },
	{ "error", "0, or the negative libte error code that ended the task" },
	{ "transferred", "bytes moved so far" },
	{ NULL, NULL },
};
static PyStructSequence_Desc status_desc = { "libte.TaskStatus", "The status of one task.", status_fields, 3 };

static PyStructSequence_Field info_fields[] = {
	{ "state", "TaskState" },
	{ "error", "0, or the negative libte error code that ended the task" },
	{ "transferred", "bytes moved so far" },
	{ "flags", "TASK_UNSETTLED | TASK_ENDED_EARLY" },
	{ "deadline_ns", "the task's deadline (libte.now_ns() nanoseconds), 0: none" },
	{ "unsettled", "True while a WRITE ended early may still change the peer's memory" },
	{ "ended_early", "True when a deadline or a cancel ended it before its transport finished it" },
	{ NULL, NULL },
};
static PyStructSequence_Desc info_desc = { "libte.TaskInfo", "A task's status with its deadline and flags.",
					   info_fields, 7 };

static PyStructSequence_Field notif_fields[] = {
	{ "name", "the sender's name (its segment name unless it chose another)" },
	{ "msg", "the text" },
	{ NULL, NULL },
};
static PyStructSequence_Desc notif_desc = { "libte.Notification", "A received notification.", notif_fields, 2 };

static PyStructSequence_Field sbuf_fields[] = {
	{ "addr", "address in the owner's memory (file segments: offset in the files laid end to end)" },
	{ "length", "bytes" },
	{ "name", "location (\"cpu:0\") or, for some peers, the segment name" },
	{ NULL, NULL },
};
static PyStructSequence_Desc sbuf_desc = { "libte.SegmentBuffer", "A buffer of a segment.", sbuf_fields, 3 };

static PyStructSequence_Field plugin_fields[] = {
	{ "path", "the file" },
	{ "name", "the plugin's name, or None when the file could not be read" },
	{ "version", NULL },
	{ "description", NULL },
	{ "kind", "\"transport\", \"metadata\" or None" },
	{ "abi", "(major, minor) it was built for" },
	{ "loaded", "True when usable" },
	{ "reason", "why it was skipped, or None" },
	{ NULL, NULL },
};
static PyStructSequence_Desc plugin_desc = { "libte.PluginInfo", "A plugin file the loader found.", plugin_fields, 8 };

PyTypeObject PyteTaskStatusType, PyteNotificationType, PyteSegmentBufferType, PytePluginInfoType, PyteTaskInfoType;

PyObject *pyte_struct_seq(PyTypeObject *type, PyObject **items, int n)
{
	PyObject *o = PyStructSequence_New(type);
	for (int i = 0; i < n; i++) {
		if (items[i] == NULL)
			Py_CLEAR(o);
	}
	for (int i = 0; i < n; i++) {
		if (o != NULL)
			PyStructSequence_SET_ITEM(o, i, items[i]);
		else
			Py_XDECREF(items[i]);
	}
	return o;
}

PyObject *pyte_task_status(const te_task_status *st)
{
	PyObject *items[3] = {
		PyLong_FromLong(st->state),
		PyLong_FromLong(st->error),
		PyLong_FromUnsignedLongLong(st->transferred),
	};
	return pyte_struct_seq(&PyteTaskStatusType, items, 3);
}

PyObject *pyte_task_info(const te_task_info *ti)
{
	PyObject *items[7] = {
		PyLong_FromLong(ti->state),
		PyLong_FromLong(ti->error),
		PyLong_FromUnsignedLongLong(ti->transferred),
		PyLong_FromUnsignedLong(ti->flags),
		PyLong_FromLongLong(ti->deadline_ns),
		PyBool_FromLong((ti->flags & TE_TASK_UNSETTLED) != 0),
		PyBool_FromLong((ti->flags & TE_TASK_ENDED_EARLY) != 0),
	};
	return pyte_struct_seq(&PyteTaskInfoType, items, 7);
}

/* ------------------------------------------------------------ functions */

static PyObject *mod_now_ns(PyObject *m, PyObject *unused)
{
	(void)m;
	(void)unused;
	return PyLong_FromLongLong(te_now_ns());
}

static PyObject *mod_version(PyObject *m, PyObject *unused)
{
	(void)m;
	(void)unused;
	return PyUnicode_FromString(te_version());
}

static PyObject *mod_strerror(PyObject *m, PyObject *arg)
{
	(void)m;
	long code = PyLong_AsLong(arg);
	if (code == -1 && PyErr_Occurred())
		return NULL;
	if (code < INT32_MIN || code > INT32_MAX) {
		PyErr_SetString(PyExc_OverflowError, "strerror(): code out of range");
		return NULL;
	}
	return PyUnicode_FromString(te_strerror((int)code));
}

static int parse_level(PyObject *arg, int *out)
{
	static const char *const names[] = { "error", "warn", "info", "debug", "trace" };

	if (PyUnicode_Check(arg)) {
		const char *s = PyUnicode_AsUTF8(arg);
		if (s == NULL)
			return -1;
		for (int i = 0; i < 5; i++)
			if (strcasecmp(s, names[i]) == 0) {
				*out = i;
				return 0;
			}
		if (strcasecmp(s, "warning") == 0) {
			*out = TE_LOG_WARN;
			return 0;
		}
		PyErr_Format(PyExc_ValueError, "log level '%s': want error, warn, info, debug or trace", s);
		return -1;
	}
	long l = PyLong_AsLong(arg);
	if (l == -1 && PyErr_Occurred())
		return -1;
	if (l < TE_LOG_ERROR || l > TE_LOG_TRACE) {
		PyErr_Format(PyExc_ValueError, "log level %ld is outside 0 (error) .. 4 (trace)", l);
		return -1;
	}
	*out = (int)l;
	return 0;
}

static PyObject *mod_set_log_level(PyObject *m, PyObject *arg)
{
	(void)m;
	int level;
	if (parse_level(arg, &level) < 0)
		return NULL;
	te_set_log_level(level);
	Py_RETURN_NONE;
}

static PyObject *mod_get_log_level(PyObject *m, PyObject *unused)
{
	(void)m;
	(void)unused;
	return PyLong_FromLong(te_get_log_level());
}

static PyObject *opt_str(const char *s)
{
	if (s == NULL)
		Py_RETURN_NONE;
	return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static void plugin_cb(const te_plugin_info *info, void *user)
{
	PyObject *list = user, *o;

	if (PyErr_Occurred())
		return;
	const char *kind = info->kind == TE_KIND_TRANSPORT ? "transport" : info->kind == TE_KIND_METADATA ? "metadata" : NULL;
	PyObject *items[8] = {
		opt_str(info->path),
		opt_str(info->name),
		opt_str(info->version),
		opt_str(info->description),
		opt_str(kind),
		Py_BuildValue("(II)", info->abi_major, info->abi_minor),
		PyBool_FromLong(info->loaded),
		opt_str(info->loaded ? NULL : info->reason),
	};
	o = pyte_struct_seq(&PytePluginInfoType, items, 8);
	if (o == NULL)
		return;
	PyList_Append(list, o);
	Py_DECREF(o);
}

static PyObject *mod_plugins(PyObject *m, PyObject *unused)
{
	(void)m;
	(void)unused;
	PyObject *list = PyList_New(0);
	if (list == NULL)
		return NULL;
	te_plugin_foreach(plugin_cb, list);
	if (PyErr_Occurred()) {
		Py_DECREF(list);
		return NULL;
	}
	return list;
}

static PyObject *mod_plugin_report(PyObject *m, PyObject *arg)
{
	(void)m;
	const char *name = PyUnicode_AsUTF8(arg);
	char *text = NULL;
	int rc;

	if (name == NULL)
		return NULL;
	te_last_error_clear();
	Py_BEGIN_ALLOW_THREADS
	rc = te_plugin_report(name, &text);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return pyte_raise_msg(rc, "plugin_report('%s'): %s", name, te_strerror(rc));
	PyObject *r = opt_str(text);
	te_free(text);
	return r;
}

/* ------------------------------------------------------- device memory */

static PyObject *mod_device_alloc(PyObject *m, PyObject *args)
{
	(void)m;
	const char *loc;
	Py_ssize_t size;
	void *p = NULL;
	int rc;

	if (!PyArg_ParseTuple(args, "sn:device_alloc", &loc, &size))
		return NULL;
	if (size <= 0)
		return pyte_raise_msg(-EINVAL, "device_alloc('%s', %zd): the size must be positive", loc, size);
	te_last_error_clear();
	Py_BEGIN_ALLOW_THREADS
	rc = te_device_alloc(loc, (size_t)size, &p);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return pyte_raise_msg(rc, "device_alloc('%s', %zd): %s", loc, size, te_strerror(rc));
	return PyLong_FromVoidPtr(p);
}

static PyObject *mod_device_free(PyObject *m, PyObject *arg)
{
	(void)m;
	void *p = PyLong_AsVoidPtr(arg);
	int rc;

	if (p == NULL && PyErr_Occurred())
		return NULL;
	te_last_error_clear();
	Py_BEGIN_ALLOW_THREADS
	rc = te_device_free(p);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return pyte_raise_msg(rc, "device_free(%p): %s", p, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *mod_device_copy(PyObject *m, PyObject *args)
{
	(void)m;
	PyObject *dst_o, *src_o;
	Py_ssize_t size;
	int rc;

	if (!PyArg_ParseTuple(args, "OOn:device_copy", &dst_o, &src_o, &size))
		return NULL;
	void *dst = PyLong_AsVoidPtr(dst_o), *src = PyLong_AsVoidPtr(src_o);
	if (PyErr_Occurred())
		return NULL;
	if (size < 0)
		return pyte_raise_msg(-EINVAL, "device_copy: negative size %zd", size);
	te_last_error_clear();
	Py_BEGIN_ALLOW_THREADS
	rc = te_device_copy(dst, src, (size_t)size);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return pyte_raise_msg(rc, "device_copy(%p <- %p, %zd): %s", dst, src, size, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *mod_device_locate(PyObject *m, PyObject *args)
{
	(void)m;
	PyObject *addr_o;
	Py_ssize_t size = 1;
	char loc[64];
	int rc;

	if (!PyArg_ParseTuple(args, "O|n:device_locate", &addr_o, &size))
		return NULL;
	void *p = PyLong_AsVoidPtr(addr_o);
	if (PyErr_Occurred())
		return NULL;
	if (size <= 0)
		return pyte_raise_msg(-EINVAL, "device_locate: the size must be positive");
	Py_BEGIN_ALLOW_THREADS
	rc = te_device_locate(p, (size_t)size, loc, sizeof loc);
	Py_END_ALLOW_THREADS
	if (rc == -ENOENT)
		Py_RETURN_NONE;
	if (rc < 0)
		return pyte_raise_msg(rc, "device_locate(%p): %s", p, te_strerror(rc));
	return PyUnicode_FromString(loc);
}

static PyObject *mod_device_stream_wait(PyObject *m, PyObject *args)
{
	(void)m;
	const char *loc;
	PyObject *stream_o;
	int rc;

	if (!PyArg_ParseTuple(args, "sO:device_stream_wait", &loc, &stream_o))
		return NULL;
	void *stream = PyLong_AsVoidPtr(stream_o);
	if (PyErr_Occurred())
		return NULL;
	te_last_error_clear();
	Py_BEGIN_ALLOW_THREADS
	rc = te_device_stream_wait(loc, stream);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		return pyte_raise_msg(rc, "device_stream_wait('%s'): %s", loc, te_strerror(rc));
	Py_RETURN_NONE;
}

static PyObject *mod_segment_key(PyObject *m, PyObject *arg)
{
	(void)m;
	const char *name = PyUnicode_AsUTF8(arg);
	char buf[1024];

	if (name == NULL)
		return NULL;
	te_last_error_clear();
	int rc = te_metadata_segment_key(name, buf, sizeof buf);
	if (rc < 0)
		return pyte_raise(rc, "segment_key");
	if ((size_t)rc >= sizeof buf)
		return pyte_raise(-ENAMETOOLONG, "segment_key");
	return PyUnicode_FromString(buf);
}

static PyObject *mod_buffer_address(PyObject *m, PyObject *arg)
{
	(void)m;
	uint64_t addr;
	int64_t len;
	if (PyLong_Check(arg)) {
		PyErr_SetString(PyExc_TypeError, "buffer_address() wants an object with the buffer protocol, not an int");
		return NULL;
	}
	if (pyte_local_addr(arg, &addr, &len) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(addr);
}

/* ------------------------------------------------------------- Memory */

/*
 * Page-aligned memory outside Python's heap, from te_mem_alloc(): shared
 * memory an engine on this host maps (the same-host transport then serves it
 * with one memcpy). Its address never changes and it does not move or shrink
 * while exported. Exposes the buffer protocol; close() frees it, refused
 * while a memoryview (or a registration) still uses it.
 */
typedef struct {
	PyObject_HEAD
	void *addr;
	size_t length; /* what the caller asked for */
	Py_ssize_t exports;
} PyteMemory;

static PyObject *mem_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "size", NULL };
	Py_ssize_t size;
	PyteMemory *self;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "n:Memory", kwlist, &size) ||
	    pyte_positive_arg("Memory", "size", size) < 0)
		return NULL;
	self = (PyteMemory *)type->tp_alloc(type, 0);
	if (self == NULL)
		return NULL;
	void *p = NULL;
	te_last_error_clear();
	Py_BEGIN_ALLOW_THREADS
	rc = te_mem_alloc((size_t)size, &p);
	Py_END_ALLOW_THREADS
	if (rc < 0) {
		Py_DECREF(self);
		return pyte_raise_msg(rc, "Memory(%zd): %s", size, te_strerror(rc));
	}
	self->addr = p;
	self->length = (size_t)size;
	return (PyObject *)self;
}

static void mem_unmap(PyteMemory *self)
{
	if (self->addr != NULL) {
		te_mem_free(self->addr);
		self->addr = NULL;
	}
}

static void mem_dealloc(PyteMemory *self)
{
	mem_unmap(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int mem_getbuffer(PyteMemory *self, Py_buffer *view, int flags)
{
	if (self->addr == NULL) {
		PyErr_SetString(PyExc_ValueError, "this Memory is closed");
		view->obj = NULL;
		return -1;
	}
	int rc = PyBuffer_FillInfo(view, (PyObject *)self, self->addr, (Py_ssize_t)self->length, 0, flags);
	if (rc == 0)
		self->exports++;
	return rc;
}

static void mem_releasebuffer(PyteMemory *self, Py_buffer *view)
{
	(void)view;
	self->exports--;
}

static PyObject *mem_close(PyteMemory *self, PyObject *unused)
{
	(void)unused;
	if (self->exports > 0) {
		PyErr_Format(PyExc_BufferError,
			     "Memory.close(): %zd export(s) still use it (a memoryview, or a registration)",
			     self->exports);
		return NULL;
	}
	mem_unmap(self);
	Py_RETURN_NONE;
}

static PyObject *mem_get_address(PyteMemory *self, void *c)
{
	(void)c;
	if (self->addr == NULL) {
		PyErr_SetString(PyExc_ValueError, "this Memory is closed");
		return NULL;
	}
	return PyLong_FromVoidPtr(self->addr);
}

static PyObject *mem_get_closed(PyteMemory *self, void *c)
{
	(void)c;
	return PyBool_FromLong(self->addr == NULL);
}

static Py_ssize_t mem_len(PyteMemory *self)
{
	return (Py_ssize_t)self->length;
}

static PyObject *mem_repr(PyteMemory *self)
{
	if (self->addr == NULL)
		return PyUnicode_FromString("<libte.Memory closed>");
	return PyUnicode_FromFormat("<libte.Memory %zu bytes at %p>", self->length, self->addr);
}

static PyBufferProcs mem_as_buffer = {
	.bf_getbuffer = (getbufferproc)mem_getbuffer,
	.bf_releasebuffer = (releasebufferproc)mem_releasebuffer,
};
static PySequenceMethods mem_as_seq = { .sq_length = (lenfunc)mem_len };
static PyMethodDef mem_methods[] = {
	{ "close", (PyCFunction)mem_close, METH_NOARGS,
	  "Unmaps the memory. Raises BufferError while a memoryview or a registration uses it." },
	PYTE_CLOSING_CTX_METHODS,
	{ NULL, NULL, 0, NULL },
};
static PyGetSetDef mem_getset[] = {
	{ "address", (getter)mem_get_address, NULL, "The first byte's address (an int).", NULL },
	{ "closed", (getter)mem_get_closed, NULL, "True after close().", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject PyteMemoryType = {
	PYTE_TYPE_HEAD("libte.Memory", PyteMemory, mem_dealloc, mem_repr),
	.tp_as_sequence = &mem_as_seq,
	.tp_as_buffer = &mem_as_buffer,
	.tp_doc = "Memory(size)\n--\n\n"
		  "Page-aligned, zeroed memory outside Python's heap (te_mem_alloc: shared memory that\n"
		  "an engine on this host maps, so the same-host transport serves it with one copy),\n"
		  "for buffers that peers read and write. Supports the buffer protocol (memoryview,\n"
		  "numpy.frombuffer), has an `address`, and is freed by close() or when collected.",
	.tp_methods = mem_methods,
	.tp_getset = mem_getset,
	.tp_new = mem_new,
};

/* -------------------------------------------------------------- module */

static PyMethodDef mod_methods[] = {
	{ "version", mod_version, METH_NOARGS, "version()\n--\n\nlibte's version, e.g. \"1.1.0\"." },
	{ "now_ns", mod_now_ns, METH_NOARGS,
	  "now_ns()\n--\n\nThe clock of deadlines: CLOCK_MONOTONIC in nanoseconds (te_now_ns(), the clock of\n"
	  "time.monotonic_ns()). A deadline 0.5 s from now is libte.now_ns() + 500_000_000." },
	{ "strerror", mod_strerror, METH_O, "strerror(code)\n--\n\nThe text of a libte error code." },
	{ "set_log_level", mod_set_log_level, METH_O,
	  "set_log_level(level)\n--\n\nlibte's log level, process-wide: 0..4 or error, warn, info, debug, trace.\n"
	  "The log goes to stderr; the initial level comes from TE_LOG_LEVEL (default warn)." },
	{ "get_log_level", mod_get_log_level, METH_NOARGS, "get_log_level()\n--\n\nThe current log level (0..4)." },
	{ "plugins", mod_plugins, METH_NOARGS,
	  "plugins()\n--\n\nEvery plugin file the loader found, as PluginInfo, usable or not." },
	{ "plugin_report", mod_plugin_report, METH_O,
	  "plugin_report(name)\n--\n\nA transport plugin's report on this machine (devices, topology),\n"
	  "or why it cannot work here." },
	{ "segment_key", mod_segment_key, METH_O,
	  "segment_key(name)\n--\n\nThe metadata key of a segment's descriptor (\"mooncake/ram/<name>\")." },
	{ "device_alloc", mod_device_alloc, METH_VARARGS,
	  "device_alloc(location, size)\n--\n\nAllocates device memory (\"cuda:0\") through the device plugin\n"
	  "serving it; returns its address (an int). The CPU cannot touch it: use device_copy()." },
	{ "device_free", mod_device_free, METH_O,
	  "device_free(address)\n--\n\nFrees memory from device_alloc()." },
	{ "device_copy", mod_device_copy, METH_VARARGS,
	  "device_copy(dst, src, size)\n--\n\nCopies size bytes between addresses (ints), either of them\n"
	  "device memory of a device plugin." },
	{ "device_locate", mod_device_locate, METH_VARARGS,
	  "device_locate(address, size=1)\n--\n\nThe device (\"cuda:3\") whose memory holds the range, or None\n"
	  "for host memory." },
	{ "device_stream_wait", mod_device_stream_wait, METH_VARARGS,
	  "device_stream_wait(location, stream)\n--\n\nWaits until the work queued on a device stream (an int:\n"
	  "torch.cuda.Stream().cuda_stream) of the device runtime of `location` has finished." },
	{ "buffer_address", mod_buffer_address, METH_O,
	  "buffer_address(obj)\n--\n\nThe address of the first byte of an object with the buffer protocol." },
	{ NULL, NULL, 0, NULL },
};

static struct PyModuleDef native_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "libte._native",
	.m_doc = "The compiled core of the libte package (use `import libte`).",
	.m_size = -1,
	.m_methods = mod_methods,
};

static int add_error(PyObject *m, const char *name, PyObject *bases, const char *doc, PyObject **out)
{
	char full[96];
	snprintf(full, sizeof full, "libte.%s", name);
	*out = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	if (*out == NULL)
		return -1;
	return PyModule_AddObjectRef(m, name, *out);
}

/* libte.Error, then its subclasses from exc_table. */
static int add_errors(PyObject *m)
{
	if (add_error(m, "Error", PyExc_Exception,
		      "A libte call failed. `code` is libte's (negative) error code, `detail` the\n"
		      "line libte logged about it (may be empty).",
		      &PyteError) < 0)
		return -1;
	for (size_t i = 0; i < sizeof exc_table / sizeof *exc_table; i++) {
		const struct pyte_exc *x = &exc_table[i];
		PyObject *bases = x->builtin ? PyTuple_Pack(2, PyteError, *x->builtin) : PyTuple_Pack(1, PyteError);
		if (bases == NULL)
			return -1;
		int rc = add_error(m, x->name, bases, x->doc, x->cls);
		Py_DECREF(bases);
		if (rc < 0)
			return -1;
	}
	return 0;
}

static int add_codes(PyObject *m)
{
	static const struct { const char *n; int v; } codes[] = {
		{ "ERR_PLUGIN", TE_ERR_PLUGIN },
		{ "ERR_NO_TRANSPORT", TE_ERR_NO_TRANSPORT },
		{ "ERR_METADATA", TE_ERR_METADATA },
		{ "ERR_PROTOCOL", TE_ERR_PROTOCOL },
		{ "ERR_REJECTED", TE_ERR_REJECTED },
		{ "ERR_BATCH_FULL", TE_ERR_BATCH_FULL },
		{ "ERR_ADDRESS", TE_ERR_ADDRESS },
		{ "ERR_OVERLAP", TE_ERR_OVERLAP },
		{ "ERR_SEGMENT", TE_ERR_SEGMENT },
		{ "ERR_BATCH", TE_ERR_BATCH },
		{ "ERR_AUTH", TE_ERR_AUTH },
		{ "READ", TE_OP_READ },
		{ "WRITE", TE_OP_WRITE },
		{ "LOCAL_SEGMENT", TE_LOCAL_SEGMENT },
		{ "NOTIFY_MAX", TE_NOTIFY_MAX },
		{ "ABI_MAJOR", TE_ABI_MAJOR },
		{ "ABI_MINOR", TE_ABI_MINOR },
		{ "TASK_UNSETTLED", TE_TASK_UNSETTLED },
		{ "TASK_ENDED_EARLY", TE_TASK_ENDED_EARLY },
	};
	for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
		if (PyModule_AddIntConstant(m, codes[i].n, codes[i].v) < 0)
			return -1;
	return 0;
}

PyMODINIT_FUNC PyInit__native(void)
{
	PyObject *m = PyModule_Create(&native_module);
	if (m == NULL)
		return NULL;
	if (PyStructSequence_InitType2(&PyteTaskStatusType, &status_desc) < 0 ||
	    PyStructSequence_InitType2(&PyteNotificationType, &notif_desc) < 0 ||
	    PyStructSequence_InitType2(&PyteSegmentBufferType, &sbuf_desc) < 0 ||
	    PyStructSequence_InitType2(&PytePluginInfoType, &plugin_desc) < 0 ||
	    PyStructSequence_InitType2(&PyteTaskInfoType, &info_desc) < 0)
		goto fail;
	if (PyModule_AddObjectRef(m, "TaskStatus", (PyObject *)&PyteTaskStatusType) < 0 ||
	    PyModule_AddObjectRef(m, "Notification", (PyObject *)&PyteNotificationType) < 0 ||
	    PyModule_AddObjectRef(m, "SegmentBuffer", (PyObject *)&PyteSegmentBufferType) < 0 ||
	    PyModule_AddObjectRef(m, "PluginInfo", (PyObject *)&PytePluginInfoType) < 0 ||
	    PyModule_AddObjectRef(m, "TaskInfo", (PyObject *)&PyteTaskInfoType) < 0)
		goto fail;
	PyTypeObject *types[] = { &PyteEngineType, &PyteSegmentType, &PyteBatchType, &PyteMemoryType,
				  &PyteXferListType };
	const char *names[] = { "Engine", "Segment", "Batch", "Memory", "XferList" };
	for (size_t i = 0; i < 5; i++)
		if (PyType_Ready(types[i]) < 0 || PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0)
			goto fail;

	if (add_errors(m) < 0 || add_codes(m) < 0)
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
