/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The log line and the one table that turns libte's error codes into
 * Mooncake's error.h codes and Status codes.
 */
#include "mc-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

/* ----------------------------------------------------------------- logging */

/* Through libte's log (its level and handler), under the domain "mooncake". */
void mc_log(int level, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (level > te_get_log_level())
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	te_log_write(level, "mooncake", line);
}

/* ------------------------------------------------------------ error codes */

/*
 * libte's codes by what they are in Mooncake: a class's negative error.h
 * code and positive Status code, then the libte codes that map to it (the
 * list ends at the first 0, which is no error). Codes not listed map to
 * invalid argument (and the caller logs libte's name for them).
 */
static const struct mc_code_class {
	int err;
	int status;
	int te[14];
} code_classes[] = {
	{ ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT,
	  { -EINVAL, TE_ERR_SEGMENT, TE_ERR_BATCH, -ENOENT, -EEXIST, -ENAMETOOLONG, -EMSGSIZE, -ERANGE,
	    -EPROTONOSUPPORT } },
	{ ERR_TOO_MANY_REQUESTS, MC_STATUS_CODE_TOO_MANY_REQUESTS, { TE_ERR_BATCH_FULL, -ENOSPC } },
	{ ERR_ADDRESS_NOT_REGISTERED, MC_STATUS_CODE_ADDRESS_NOT_REGISTERED, { TE_ERR_ADDRESS } },
	{ ERR_BATCH_BUSY, MC_STATUS_CODE_BATCH_BUSY, { -EBUSY } },
	/* error.h has no "not supported transport": a missing transport is a
	 * device not found there, as Mooncake's RDMA paths report it. */
	{ ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_NOT_SUPPORTED_TRANSPORT, { TE_ERR_NO_TRANSPORT } },
	{ ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_DEVICE_NOT_FOUND, { TE_ERR_PLUGIN } },
	{ ERR_ADDRESS_OVERLAPPED, MC_STATUS_CODE_ADDRESS_OVERLAPPED, { TE_ERR_OVERLAP } },
	{ ERR_SOCKET, MC_STATUS_CODE_SOCKET,
	  { -ECONNREFUSED, -ECONNRESET, -ECONNABORTED, -EHOSTUNREACH, -EHOSTDOWN, -ENETUNREACH, -ENETDOWN,
	    -ENOTCONN, -EPIPE, -ETIMEDOUT, -EADDRINUSE, -EADDRNOTAVAIL, -EIO } },
	{ ERR_MALFORMED_JSON, MC_STATUS_CODE_MALFORMED_JSON, { TE_ERR_PROTOCOL } },
	{ ERR_REJECT_HANDSHAKE, MC_STATUS_CODE_REJECT_HANDSHAKE, { TE_ERR_REJECTED } },
	{ ERR_METADATA, MC_STATUS_CODE_METADATA, { TE_ERR_METADATA } },
	/* the engine is going away or the work was called off */
	{ ERR_CONTEXT, MC_STATUS_CODE_CONTEXT, { -ESHUTDOWN, -ECANCELED } },
	{ ERR_MEMORY, MC_STATUS_CODE_MEMORY, { -ENOMEM } },
	{ ERR_NOT_IMPLEMENTED, MC_STATUS_CODE_NOT_IMPLEMENTED, { -ENOTSUP } },
};

/* The class of a libte error (< 0); a code no class lists is logged with
 * libte's name for it and reads as invalid argument. */
static const struct mc_code_class *code_find(const char *fn, int te_rc)
{
	static const struct mc_code_class unknown = { ERR_INVALID_ARGUMENT,
						      MC_STATUS_CODE_INVALID_ARGUMENT, { 0 } };
	const size_t per_class = sizeof code_classes[0].te / sizeof code_classes[0].te[0];

	for (size_t i = 0; i < sizeof code_classes / sizeof code_classes[0]; i++)
		for (size_t k = 0; k < per_class && code_classes[i].te[k] != 0; k++)
			if (code_classes[i].te[k] == te_rc)
				return &code_classes[i];
	mc_err("%s: %s (libte error %d, reported as invalid argument)", fn, te_strerror(te_rc),
	       te_rc);
	return &unknown;
}

/* libte error (< 0) -> Mooncake negative error; 0 and above pass through. */
int to_err(const char *fn, int te_rc)
{
	return te_rc >= 0 ? te_rc : code_find(fn, te_rc)->err;
}

/* libte error (< 0) -> Mooncake positive Status code; 0 stays 0. */
int to_status(const char *fn, int te_rc)
{
	return te_rc >= 0 ? MC_STATUS_CODE_OK : code_find(fn, te_rc)->status;
}
