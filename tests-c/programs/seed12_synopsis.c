/* A program written from the three DAT 1.2 seed manual pages
 * (dat_ep_post_rdma_read, dat_ep_post_send, dat_rmr_bind; each says
 * "#include <dat/udat.h>", "cc ... -ldat"), compiled against include/dat
 * and linked with -ldat into test_dat12_rules, which calls each function
 * with live objects (tests-c/Makefile): a header that no longer fits the
 * pages stops the build, a library that does not match the header stops
 * the link or fails the test.
 *
 * Each function takes exactly the argument types of one page's synopsis,
 * calls that page's function with them, passes the completion and
 * privilege flags the page lists by name, and handles every return code
 * the page lists in a switch (so each must be a distinct integer constant
 * of the right type). */
#include <dat/udat.h>

/* dat_ep_post_rdma_read(3DAT). */
int seed_ep_post_rdma_read(DAT_EP_HANDLE ep_handle, DAT_COUNT num_segments,
			   DAT_LMR_TRIPLET *local_iov, DAT_DTO_COOKIE user_cookie,
			   DAT_RMR_TRIPLET *remote_buffer,
			   DAT_COMPLETION_FLAGS completion_flags)
{
	DAT_RETURN rc = dat_ep_post_rdma_read(ep_handle, num_segments, local_iov,
					      user_cookie, remote_buffer, completion_flags);
	if (rc == DAT_SUCCESS)
		/* The flags the page lists: suppression (0x01),
		 * non-notification (0x04), barrier fence (0x08), default. */
		rc = dat_ep_post_rdma_read(ep_handle, num_segments, local_iov, user_cookie,
					   remote_buffer,
					   DAT_COMPLETION_SUPPRESS_FLAG |
						   DAT_COMPLETION_UNSIGNALLED_FLAG |
						   DAT_COMPLETION_BARRIER_FENCE_FLAG |
						   DAT_COMPLETION_DEFAULT_FLAG);
	switch (DAT_GET_TYPE(rc)) {
	case DAT_SUCCESS:
		return 0;
	case DAT_INSUFFICIENT_RESOURCES:
	case DAT_INVALID_PARAMETER:
	case DAT_INVALID_HANDLE:
	case DAT_INVALID_STATE:
	case DAT_LENGTH_ERROR:
	case DAT_PROTECTION_VIOLATION:
	case DAT_PRIVILEGES_VIOLATION:
		return 1;
	default:
		return 2;
	}
}

/* dat_ep_post_send(3DAT). */
int seed_ep_post_send(DAT_EP_HANDLE ep_handle, DAT_COUNT num_segments,
		      DAT_LMR_TRIPLET *local_iov, DAT_DTO_COOKIE user_cookie,
		      DAT_COMPLETION_FLAGS completion_flags)
{
	DAT_RETURN rc = dat_ep_post_send(ep_handle, num_segments, local_iov, user_cookie,
					 completion_flags);
	if (rc == DAT_SUCCESS) {
		/* "Can be 0 for 0 size message", "Can be NULL for 0 size
		 * message", a NULL cookie, and the flags the page lists:
		 * suppression (0x01), solicited wait (0x02), non-notification
		 * (0x04), barrier fence (0x08). */
		DAT_DTO_COOKIE null_cookie;
		null_cookie.as_ptr = NULL;
		rc = dat_ep_post_send(ep_handle, 0, NULL, null_cookie,
				      DAT_COMPLETION_SUPPRESS_FLAG |
					      DAT_COMPLETION_SOLICITED_WAIT_FLAG |
					      DAT_COMPLETION_UNSIGNALLED_FLAG |
					      DAT_COMPLETION_BARRIER_FENCE_FLAG);
	}
	switch (DAT_GET_TYPE(rc)) {
	case DAT_SUCCESS:
		return 0;
	case DAT_INSUFFICIENT_RESOURCES:
	case DAT_INVALID_PARAMETER:
	case DAT_INVALID_HANDLE:
	case DAT_INVALID_STATE:
	case DAT_PROTECTION_VIOLATION:
	case DAT_PRIVILEGES_VIOLATION:
		return 1;
	default:
		return 2;
	}
}

/* dat_rmr_bind(3DAT): 7 arguments in DAT 1.2. */
int seed_rmr_bind(DAT_RMR_HANDLE rmr_handle, DAT_LMR_TRIPLET *lmr_triplet,
		  DAT_MEM_PRIV_FLAGS mem_privileges, DAT_EP_HANDLE ep_handle,
		  DAT_RMR_COOKIE user_cookie, DAT_COMPLETION_FLAGS completion_flags,
		  DAT_RMR_CONTEXT *rmr_context)
{
	DAT_RETURN rc = dat_rmr_bind(rmr_handle, lmr_triplet, mem_privileges, ep_handle,
				     user_cookie, completion_flags, rmr_context);
	if (rc == DAT_SUCCESS) {
		/* The privileges the page names (default NONE, ALL = 0x33,
		 * remote read 0x02, remote write 0x20, and the LMR's local
		 * read/write they require) and its completion flags. */
		DAT_MEM_PRIV_FLAGS priv = DAT_MEM_PRIV_NONE_FLAG;
		if (mem_privileges == DAT_MEM_PRIV_ALL_FLAG)
			priv = DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG |
			       DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG;
		rc = dat_rmr_bind(rmr_handle, lmr_triplet, priv, ep_handle, user_cookie,
				  DAT_COMPLETION_DEFAULT_FLAG | DAT_COMPLETION_SUPPRESS_FLAG |
					  DAT_COMPLETION_UNSIGNALLED_FLAG |
					  DAT_COMPLETION_BARRIER_FENCE_FLAG,
				  rmr_context);
	}
	switch (DAT_GET_TYPE(rc)) {
	case DAT_SUCCESS:
		return 0;
	case DAT_INSUFFICIENT_RESOURCES:
	case DAT_INVALID_PARAMETER:
	case DAT_INVALID_HANDLE:
	case DAT_INVALID_STATE:
	case DAT_MODEL_NOT_SUPPORTED:
	case DAT_PRIVILEGES_VIOLATION:
	case DAT_PROTECTION_VIOLATION:
		return 1;
	default:
		return 2;
	}
}

/* Other names the three pages use: the EP states the operations are valid
 * in, the event a failed bind delivers, the portable buffer alignment. */
int seed_other_names(DAT_EP_STATE state, DAT_EVENT_NUMBER event, DAT_VADDR address)
{
	int valid = state == DAT_EP_STATE_CONNECTED || state == DAT_EP_STATE_DISCONNECTED;
	int broken = event == DAT_CONNECTION_EVENT_BROKEN;
	int aligned = address % DAT_OPTIMAL_ALIGNMENT == 0;
	return valid + 2 * broken + 4 * aligned;
}
