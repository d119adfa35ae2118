/* vrpc_version(): the version the library was built with, from VERSION. */
#include <verbrpc/common.h>

const char *vrpc_version(void) { return VRPC_VERSION_STRING; }

unsigned vrpc_version_number(void) { return VRPC_VERSION_NUMBER; }
