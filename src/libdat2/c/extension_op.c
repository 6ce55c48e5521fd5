/* dat_extension_op is C-variadic, which stable Rust cannot define: this
 * shim collects the variable arguments into a va_list and hands them to
 * the Rust side, which forwards them to the provider's extension slot. */
#include <stdarg.h>
#include <stdint.h>

typedef uint32_t DAT_RETURN;
extern DAT_RETURN dat2_extension_opv(void *handle, int ext_op, va_list args);

DAT_RETURN dat_extension_op(void *handle, int ext_op, ...)
{
	DAT_RETURN status;
	va_list args;

	va_start(args, ext_op);
	status = dat2_extension_opv(handle, ext_op, args);
	va_end(args);
	return status;
}
