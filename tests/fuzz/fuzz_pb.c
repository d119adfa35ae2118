/* The protobuf unpack guard (rpc/pbutil.c): vrpc_pb_check_depth,
 * vrpc_pb_unpack and vrpc_pb_unpack_ref over the test protos' types that go
 * to protobuf-c: Node (nests itself), Multi (nested Inner, repeated bytes,
 * big bytes values referenced in place), NotFlat (repeated scalars), and the
 * flat EchoRequest. The first input byte picks the type, the rest is the
 * message. Checks:
 *  - vrpc_pb_unpack against protobuf-c (tests/rpc/pb_compare.c): refused
 *    alike, or accepted alike with the same fields and bytes when packed
 *    (unless the guard says too deep, where protobuf-c is not asked);
 *  - the guard refuses nothing protobuf-c accepts apart from depth, whether
 *    or not the type can nest: a -EBADMSG from vrpc_pb_check_depth means
 *    protobuf-c refuses too;
 *  - vrpc_pb_unpack_ref gives vrpc_pb_unpack's outcome and fields, and its
 *    referenced values point into the input. */
#include <errno.h>
#include <string.h>
#include "fuzz_common.h"
#include "pb_compare.h"
#include "pb_flat3.pb-c.h"
#include "rpc/pbutil.h"
#include "rpc_test.pb-c.h"

static const ProtobufCMessageDescriptor *const types[] = {
    &vrpctest__node__descriptor,      &vrpctest__multi__descriptor,        &vrpctest__inner__descriptor,
    &vrpcflat3__not_flat__descriptor, &vrpctest__echo_request__descriptor,
};
#define NTYPES (sizeof(types) / sizeof(types[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct vrpc_arena a, b;
    static bool init;
    if (!init) {
        vrpc_arena_init(&a, 4096, 1 << 24);
        vrpc_arena_init(&b, 4096, 1 << 24);
        init = true;
    }
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *d = types[data[0] % NTYPES];
    const uint8_t *buf = data + 1;
    size_t len = size - 1;
    bool accepted, looped;

    const char *why = pbc_unpack_both(d, buf, len, &a, &accepted, &looped);
    FUZZ_CHECK(!why, "%s: %s", d->short_name, why);

    int depth = vrpc_pb_check_depth(d, buf, len, 0);
    FUZZ_CHECK(depth == 0 || depth == -ELOOP || depth == -EBADMSG, "check_depth returned %d", depth);
    FUZZ_CHECK(!looped || depth == -ELOOP, "vrpc_pb_unpack said too deep, the guard did not");
    if (depth == -EBADMSG) {
        ProtobufCMessage *ref = protobuf_c_message_unpack(d, NULL, len, buf);
        FUZZ_CHECK(!ref, "%s: the guard refuses a message protobuf-c accepts", d->short_name);
    }

    /* unpack_ref: same outcome and fields as unpack (its input must be writable) */
    uint8_t *copy = malloc(len ? len : 1);
    memcpy(copy, buf, len);
    ProtobufCMessage *m1 = NULL, *m2 = NULL;
    vrpc_arena_reset(&a);
    vrpc_arena_reset(&b);
    int r1 = vrpc_pb_unpack(d, buf, len, 0, &a, &m1);
    int r2 = vrpc_pb_unpack_ref(d, copy, len, 0, &b, &m2);
    FUZZ_CHECK(r1 == r2, "%s: unpack %d, unpack_ref %d", d->short_name, r1, r2);
    if (!r1) {
        why = pbc_diff_fields(m1, m2);
        FUZZ_CHECK(!why, "%s: unpack_ref: %s", d->short_name, why);
        FUZZ_CHECK(!memcmp(copy, buf, len), "unpack_ref changed its input");
    }
    free(copy);
    return 0;
}
