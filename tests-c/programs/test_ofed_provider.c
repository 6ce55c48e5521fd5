/* A third-party provider through our libdat2: Debian's libdaplofa.so.2
 * (OFED's rdma_cm provider). This machine has no RDMA device, so the open
 * must reach the provider and come back with the provider's own error,
 * not DAT_PROVIDER_NOT_FOUND from the registry. */
#include <dat2/udat.h>
#include "check.h"

int main(void)
{
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	const char *major = "", *minor = "";
	DAT_RETURN rc = dat_ia_open("ofa-test", 8, &evd, &ia);

	dat_strerror(rc, &major, &minor);
	printf("test_ofed_provider: dat_ia_open(ofa-test) via libdaplofa.so.2 = %#x %s %s\n", rc, major, minor);
	if (rc == DAT_SUCCESS) {
		/* an RDMA device after all: the provider worked end to end */
		CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	} else {
		CHECK(DAT_GET_TYPE(rc) != DAT_PROVIDER_NOT_FOUND,
		      "libdaplofa was loaded and answered itself (got %s %s)", major, minor);
	}
	return check_summary("test_ofed_provider");
}
