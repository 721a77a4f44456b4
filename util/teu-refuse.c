/* SPDX-License-Identifier: Apache-2.0 */
#include <gio/gio.h>
#include <string.h>

#include "teu-refuse.h"

static gboolean teu_refusal__send(gpointer data)
{
	teu_refusal *r = data;
	GIOStream *io = soup_server_message_steal_connection(r->msg);

	if (io != NULL) {
		char *server = r->server ? g_strdup_printf("Server: %s\r\n", r->server) : g_strdup("");
		char *auth = r->status == SOUP_STATUS_UNAUTHORIZED
				     ? g_strdup_printf("WWW-Authenticate: Bearer realm=\"%s\"\r\n", r->realm)
				     : g_strdup("");
		char *resp = g_strdup_printf("HTTP/1.1 %u %s\r\n%sContent-Type: text/plain\r\nContent-Length: %zu\r\n"
					     "%sConnection: close\r\n\r\n%s",
					     r->status, soup_status_get_phrase(r->status), server, strlen(r->text),
					     auth, r->text);
		GOutputStream *os = g_io_stream_get_output_stream(io);
		/* Best effort, bounded by the socket's buffer: the client may be
		 * blocked sending the body that is refused. */
		g_pollable_output_stream_write_nonblocking(G_POLLABLE_OUTPUT_STREAM(os), resp, strlen(resp), NULL,
							   NULL);
		g_io_stream_close(io, NULL, NULL);
		g_object_unref(io);
		g_free(resp);
		g_free(auth);
		g_free(server);
	}
	return G_SOURCE_REMOVE;
}

/* Also when the context goes away with the refusal still queued. */
static void teu_refusal__free(gpointer data)
{
	teu_refusal *r = data;

	g_object_unref(r->msg);
	g_free(r->text);
	g_free(r);
}

/* Refuses `msg` with `status` and the body `text` (taken, freed here). The
 * message is paused now and the reply sent from an idle source of `ctx`
 * (NULL: the default context), the context whose loop runs the server, once
 * the handler calling this has returned to libsoup. */
void teu_refuse_early(GMainContext *ctx, SoupServerMessage *msg, unsigned status, const char *server, const char *realm, char *text)
{
	teu_refusal *r = g_new0(teu_refusal, 1);

	r->msg = g_object_ref(msg);
	r->status = status;
	r->server = server;
	r->realm = realm;
	r->text = text;
	soup_server_message_pause(msg);
	GSource *s = g_idle_source_new();
	g_source_set_callback(s, teu_refusal__send, r, teu_refusal__free);
	g_source_attach(s, ctx);
	g_source_unref(s);
}
