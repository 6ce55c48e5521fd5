/* dat_extension_op is C-variadic, which stable Rust cannot define: this
 * shim collects the variable arguments into a va_list and hands them to
 * the Rust side, which forwards them to the provider's extension slot.
 *
 * Two ranges of ext_op are the registry's own (as in OFED's libdat2):
 * with DAT_OPEN_EXTENSION_BASE set, the first variable argument is an IA
 * name and the registry loads that name's provider itself (the IB
 * extensions' dat_ib_open_query); the shim takes the name off the list and
 * peeks at the next argument, the DAT_HANDLE * the provider stores its IA
 * in, so that the close can find what the open took. With
 * DAT_CLOSE_EXTENSION_BASE set, the handle is such a provider IA. */
#include <stdarg.h>
#include <stdint.h>

typedef uint32_t DAT_RETURN;
extern DAT_RETURN dat2_extension_opv(void *handle, int ext_op, va_list args);
extern DAT_RETURN dat2_extension_openv(const char *name, int ext_op, void **ia_out, va_list args);
extern DAT_RETURN dat2_extension_closev(void *handle, int ext_op, va_list args);

#define DAT_OPEN_EXTENSION_BASE 0x1000
#define DAT_CLOSE_EXTENSION_BASE 0x2000

DAT_RETURN dat_extension_op(void *handle, int ext_op, ...)
{
	DAT_RETURN status;
	va_list args;

	va_start(args, ext_op);
	if (ext_op & DAT_OPEN_EXTENSION_BASE) {
		const char *name = va_arg(args, const char *);
		void **ia_out;
		va_list peek;

		va_copy(peek, args);
		ia_out = va_arg(peek, void **);
		va_end(peek);
		status = dat2_extension_openv(name, ext_op, ia_out, args);
	} else if (ext_op & DAT_CLOSE_EXTENSION_BASE) {
		status = dat2_extension_closev(handle, ext_op, args);
	} else {
		status = dat2_extension_opv(handle, ext_op, args);
	}
	va_end(args);
	return status;
}
