/* container_of: from a pointer to a member back to the object that embeds it
 * (a backend's private object embeds the public base as its first member). */
#ifndef VRPC_COMMON_CONTAINER_OF_H
#define VRPC_COMMON_CONTAINER_OF_H

#include <stddef.h>

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

#endif
