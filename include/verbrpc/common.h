/* Definitions shared by every verbrpc header: export macro, version query.
 * Conventions for the whole API: functions return 0 or a negative errno, and
 * write output pointers only on success. */
#ifndef VERBRPC_COMMON_H
#define VERBRPC_COMMON_H

#include <verbrpc/version.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VRPC_API __attribute__((visibility("default")))

/* The library's version string ("MAJOR.MINOR.PATCH"), from the VERSION file.
 * Compare with VRPC_VERSION_STRING to detect a header/library mismatch. */
VRPC_API const char *vrpc_version(void);
/* The same as one number, 0xMMmmpp. */
VRPC_API unsigned vrpc_version_number(void);

#ifdef __cplusplus
}
#endif
#endif
