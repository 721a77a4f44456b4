/* SPDX-License-Identifier: Apache-2.0 */
/* libte.Segment, and a segment's buffers and descriptor as Python values. */
#include "pyte.h"

#include <string.h>

static PyObject *segment_buffer_list(te_segment_buffer *sb, int n)
{
	PyObject *list = PyList_New(n);
	for (int i = 0; list != NULL && i < n; i++) {
		PyObject *items[3] = {
			PyLong_FromUnsignedLongLong(sb[i].addr),
			PyLong_FromUnsignedLongLong(sb[i].length),
			PyUnicode_DecodeUTF8(sb[i].name, (Py_ssize_t)strnlen(sb[i].name, sizeof sb[i].name), "replace"),
		};
		PyObject *o = pyte_struct_seq(&PyteSegmentBufferType, items, 3);
		if (o == NULL)
			Py_CLEAR(list);
		else
			PyList_SET_ITEM(list, i, o);
	}
	return list;
}

/* te_segment_buffers into a list. */
PyObject *pyte_segment_buffers(PyteEngine *eo, te_segment_id id)
{
	te_segment_buffer stack[16], *sb = stack;
	if (pyte_enter(eo) < 0)
		return NULL;
	int n = te_segment_buffers(eo->e, id, sb, 16);
	while (n > 16 && sb == stack) { /* more than fit: ask again with room (it may grow meanwhile) */
		int cap = n + 16;
		sb = PyMem_Calloc((size_t)cap, sizeof *sb);
		if (sb == NULL) {
			pyte_leave(eo);
			return PyErr_NoMemory();
		}
		n = te_segment_buffers(eo->e, id, sb, (size_t)cap);
		if (n > cap) {
			PyMem_Free(sb);
			sb = stack;
			n = te_segment_buffers(eo->e, id, sb, 16);
		}
	}
	pyte_leave(eo);
	PyObject *r = n < 0 ? pyte_raise_msg(n, "buffers of segment %d: %s", id, te_strerror(n)) : segment_buffer_list(sb, n);
	if (sb != stack)
		PyMem_Free(sb);
	return r;
}

PyObject *pyte_segment_refresh(PyteEngine *eo, te_segment_id id, PyObject *name)
{
	int rc;
	if (pyte_enter(eo) < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = name == NULL ? te_segment_refresh_all(eo->e) : te_segment_refresh(eo->e, id);
	Py_END_ALLOW_THREADS
	pyte_leave(eo);
	if (rc < 0 && name == NULL)
		return pyte_raise(rc, "refresh_segments()");
	if (rc < 0)
		return pyte_raise_msg(rc, "Segment(%U).refresh(): %s", name, te_strerror(rc));
	return name == NULL ? PyLong_FromLong(rc) : Py_NewRef(Py_None);
}

PyObject *pyte_segment_descriptor(PyteEngine *eo, te_segment_id id)
{
	char *json = NULL;
	if (pyte_enter(eo) < 0)
		return NULL;
	int rc = te_segment_descriptor(eo->e, id, &json);
	pyte_leave(eo);
	if (rc < 0)
		return pyte_raise_msg(rc, "descriptor of segment %d: %s", id, te_strerror(rc));
	PyObject *r = PyUnicode_DecodeUTF8(json, (Py_ssize_t)strlen(json), "replace");
	te_free(json);
	return r;
}

/* ------------------------------------------------------------- Segment */

typedef struct {
	PyObject_HEAD
	PyteEngine *engine;
	te_segment_id id;
	PyObject *name;
	char closed; /* a char: T_BOOL reads one */
} PyteSegment;

/* -1 with SegmentError when the segment was closed. */
static int segment_check_open(PyteSegment *s)
{
	if (s->closed) {
		pyte_raise_msg(TE_ERR_SEGMENT, "segment %U is closed", s->name);
		return -1;
	}
	return 0;
}

PyObject *pyte_segment_open(PyteEngine *eo, PyObject *name_o, const char *transport)
{
	const char *name = PyUnicode_AsUTF8(name_o);
	if (name == NULL)
		return NULL;
	/* The object first, closed: when it cannot be made, there is no open
	 * segment to undo, and when the open fails, its dealloc has nothing to
	 * close. */
	PyteSegment *s = PyObject_New(PyteSegment, &PyteSegmentType);
	if (s == NULL)
		return NULL;
	s->engine = (PyteEngine *)Py_NewRef((PyObject *)eo);
	s->id = -1;
	s->name = Py_NewRef(name_o);
	s->closed = 1;
	if (pyte_enter(eo) < 0) {
		Py_DECREF(s);
		return NULL;
	}
	te_segment_id id;
	Py_BEGIN_ALLOW_THREADS
	id = transport ? te_segment_open_with(eo->e, name, transport) : te_segment_open(eo->e, name);
	Py_END_ALLOW_THREADS
	pyte_leave(eo);
	if (id < 0) {
		pyte_raise_msg(id, "open_segment('%s'): %s", name, te_strerror(id));
		Py_DECREF(s);
		return NULL;
	}
	s->id = id;
	s->closed = 0;
	return (PyObject *)s;
}

int pyte_segment_id(PyObject *o, te_segment_id *out)
{
	if (Py_IS_TYPE(o, &PyteSegmentType)) {
		PyteSegment *s = (PyteSegment *)o;
		if (segment_check_open(s) < 0)
			return -1;
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

int pyte_segment_arg(PyObject *o, void *id)
{
	return pyte_segment_id(o, id) == 0;
}

static void segment_close_quiet(PyteSegment *s)
{
	if (s->closed)
		return;
	s->closed = 1;
	if (pyte_try_enter(s->engine) == 0) {
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

static int segment_ready(PyteSegment *s)
{
	return segment_check_open(s) < 0 ? -1 : pyte_enter(s->engine);
}

static PyObject *segment_refresh(PyteSegment *s, PyObject *unused)
{
	(void)unused;
	return segment_check_open(s) < 0 ? NULL : pyte_segment_refresh(s->engine, s->id, s->name);
}

static PyObject *segment_buffers(PyteSegment *s, PyObject *unused)
{
	(void)unused;
	return segment_check_open(s) < 0 ? NULL : pyte_segment_buffers(s->engine, s->id);
}

static PyObject *segment_descriptor(PyteSegment *s, PyObject *unused)
{
	(void)unused;
	return segment_check_open(s) < 0 ? NULL : pyte_segment_descriptor(s->engine, s->id);
}

static PyObject *segment_index(PyteSegment *s)
{
	return PyLong_FromLong(s->id);
}

static PyObject *segment_repr(PyteSegment *s)
{
	return PyUnicode_FromFormat("<libte.Segment %U id %d%s>", s->name, s->id, s->closed ? " closed" : "");
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
	PYTE_CLOSING_CTX_METHODS,
	{ NULL, NULL, 0, NULL },
};

static PyMemberDef segment_members[] = {
	{ "id", T_INT, offsetof(PyteSegment, id), READONLY, "The segment id (what requests carry)." },
	{ "name", T_OBJECT, offsetof(PyteSegment, name), READONLY, "The segment name." },
	{ "closed", T_BOOL, offsetof(PyteSegment, closed), READONLY, "True after close()." },
	{ NULL, 0, 0, 0, NULL },
};

static PyGetSetDef segment_getset[] = {
	{ "engine", (getter)segment_get_engine, NULL, "The engine that opened it.", NULL },
	{ "transport", (getter)segment_get_transport, NULL,
	  "The transport serving it (\"shm\" for an engine on this host, \"tcp\", ...).", NULL },
	{ NULL, NULL, NULL, NULL, NULL },
};

PyTypeObject PyteSegmentType = {
	PYTE_TYPE_HEAD("libte.Segment", PyteSegment, segment_dealloc, segment_repr),
	.tp_as_number = &segment_as_number,
	.tp_doc = "An open segment of another engine (from Engine.open_segment). Usable wherever a\n"
		  "segment id is (int(segment) is the id). A context manager: leaving the block closes it.",
	.tp_methods = segment_methods,
	.tp_members = segment_members,
	.tp_getset = segment_getset,
};
