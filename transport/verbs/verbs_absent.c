/* The verbs backend's table in a build without verbs (VRPC_WITH_VERBS off or
 * no libibverbs): only its name, so that "verbs" stays a known scheme and
 * opening it fails with -ENOTSUP (transport_ops.h, tp_create). */
#include "transport/transport_ops.h"

const struct vrpc_transport_ops vrpc_verbs_ops = {
    VRPC_TP_OPS_HEAD,
    .name = "verbs",
};
