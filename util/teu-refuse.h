/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Refusing an HTTP request before its body is read, for the HTTP servers
 * libte ships (the Prometheus exporter and te-metadata-server): answered
 * through libsoup, a request's whole body would be read, and kept, first,
 * which is what refusing early must avoid. So the connection is taken from
 * libsoup, a short reply is written on it and it is closed.
 * Needs libsoup 3 and GLib: in libteu-soup.
 */
#ifndef TEU_REFUSE_H
#define TEU_REFUSE_H

#include <glib.h>
#include <libsoup/soup.h>

typedef struct teu_refusal {
	SoupServerMessage *msg;
	unsigned status;
	const char *server; /* a Server header's value, or NULL for none */
	const char *realm;  /* a 401's WWW-Authenticate: Bearer realm */
	char *text;         /* the reply's body */
} teu_refusal;

/* Refuses `msg` with `status` and the body `text` (taken, freed here). The
 * message is paused now and the reply sent from an idle source of `ctx`
 * (NULL: the default context), the context whose loop runs the server, once
 * the handler calling this has returned to libsoup. */
void teu_refuse_early(GMainContext *ctx, SoupServerMessage *msg, unsigned status, const char *server, const char *realm, char *text);

#endif
