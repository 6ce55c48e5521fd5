/* DAT_RETURN: class | type | subtype. The values are in dat_types.h. */
#ifndef _DAT_ERROR_H_
#define _DAT_ERROR_H_

#include <dat/dat_types.h>

#define DAT_IS_WARNING(status) ((DAT_UINT32)(status) & DAT_CLASS_WARNING)
#define DAT_GET_TYPE(status) ((DAT_UINT32)(status) & DAT_TYPE_MASK)
#define DAT_GET_SUBTYPE(status) ((DAT_UINT32)(status) & DAT_SUBTYPE_MASK)

#endif /* _DAT_ERROR_H_ */
