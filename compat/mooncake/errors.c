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
 * libte's code -> Mooncake's negative error.h code and positive Status code.
 * Codes not listed map to invalid argument (and the caller logs libte's
 * name for them).
 */
static const struct mc_code_map {
	int te;
	int err;
	int status;
} code_map[] = {
	{ -EINVAL, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ TE_ERR_SEGMENT, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ TE_ERR_BATCH, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -ENOENT, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -EEXIST, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -ENAMETOOLONG, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -EMSGSIZE, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -ERANGE, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ -EPROTONOSUPPORT, ERR_INVALID_ARGUMENT, MC_STATUS_CODE_INVALID_ARGUMENT },
	{ TE_ERR_BATCH_FULL, ERR_TOO_MANY_REQUESTS, MC_STATUS_CODE_TOO_MANY_REQUESTS },
	{ -ENOSPC, ERR_TOO_MANY_REQUESTS, MC_STATUS_CODE_TOO_MANY_REQUESTS },
	{ TE_ERR_ADDRESS, ERR_ADDRESS_NOT_REGISTERED, MC_STATUS_CODE_ADDRESS_NOT_REGISTERED },
	{ -EBUSY, ERR_BATCH_BUSY, MC_STATUS_CODE_BATCH_BUSY },
	/* error.h has no "not supported transport": a missing transport is a
	 * device not found there, as Mooncake's RDMA paths report it. */
	{ TE_ERR_NO_TRANSPORT, ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_NOT_SUPPORTED_TRANSPORT },
	{ TE_ERR_PLUGIN, ERR_DEVICE_NOT_FOUND, MC_STATUS_CODE_DEVICE_NOT_FOUND },
	{ TE_ERR_OVERLAP, ERR_ADDRESS_OVERLAPPED, MC_STATUS_CODE_ADDRESS_OVERLAPPED },
	{ -ECONNREFUSED, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ECONNRESET, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ECONNABORTED, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EHOSTUNREACH, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EHOSTDOWN, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ENETUNREACH, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ENETDOWN, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ENOTCONN, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EPIPE, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -ETIMEDOUT, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EADDRINUSE, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EADDRNOTAVAIL, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ -EIO, ERR_SOCKET, MC_STATUS_CODE_SOCKET },
	{ TE_ERR_PROTOCOL, ERR_MALFORMED_JSON, MC_STATUS_CODE_MALFORMED_JSON },
	{ TE_ERR_REJECTED, ERR_REJECT_HANDSHAKE, MC_STATUS_CODE_REJECT_HANDSHAKE },
	{ TE_ERR_METADATA, ERR_METADATA, MC_STATUS_CODE_METADATA },
	/* the engine is going away or the work was called off */
	{ -ESHUTDOWN, ERR_CONTEXT, MC_STATUS_CODE_CONTEXT },
	{ -ECANCELED, ERR_CONTEXT, MC_STATUS_CODE_CONTEXT },
	{ -ENOMEM, ERR_MEMORY, MC_STATUS_CODE_MEMORY },
	{ -ENOTSUP, ERR_NOT_IMPLEMENTED, MC_STATUS_CODE_NOT_IMPLEMENTED },
};

/* The table's entry for a libte error (< 0); a code it does not list is
 * logged with libte's name for it and reads as invalid argument. */
static const struct mc_code_map *code_find(const char *fn, int te_rc)
{
	static const struct mc_code_map unknown = { 0, ERR_INVALID_ARGUMENT,
						     MC_STATUS_CODE_INVALID_ARGUMENT };

	for (size_t i = 0; i < sizeof code_map / sizeof code_map[0]; i++)
		if (code_map[i].te == te_rc)
			return &code_map[i];
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
