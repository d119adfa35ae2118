/* rawcall: see rawcall.h. */
#include "rawcall.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void raw_init(ProtobufCMessage *m);

/* A message type without fields: every field on the wire is unknown to it. */
static const ProtobufCMessageDescriptor raw_desc = {
    .magic = PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
    .name = "verbrpc.tool.Raw",
    .short_name = "Raw",
    .c_name = "Raw",
    .package_name = "verbrpc.tool",
    .sizeof_message = sizeof(ProtobufCMessage),
    .n_fields = 0,
    .message_init = raw_init,
};

static void raw_init(ProtobufCMessage *m)
{
    memset(m, 0, sizeof(*m));
    m->descriptor = &raw_desc;
}

int rawcall(struct vrpc_channel *ch, const char *full_name, const uint8_t *req, size_t req_len,
            const struct vrpc_call_opts *opts, uint8_t **resp, size_t *resp_len, struct vrpc_status *st)
{
    struct vrpc_method_desc m = {
        .full_name = full_name,
        .id = vrpc_method_id(full_name),
        .input = &raw_desc,
        .output = &raw_desc,
    };
    ProtobufCMessage empty, *in, *out = NULL;
    int code;

    raw_init(&empty);
    in = req_len ? protobuf_c_message_unpack(&raw_desc, NULL, req_len, req) : &empty;
    if (!in) {
        st->code = VRPC_INVALID_ARGUMENT;
        snprintf(st->message, sizeof(st->message), "request bytes do not parse as protobuf");
        return st->code;
    }
    code = vrpc_call(ch, &m, in, &out, opts, st);
    if (in != &empty)
        protobuf_c_message_free_unpacked(in, NULL);
    if (code != VRPC_OK)
        return code;
    size_t len = protobuf_c_message_get_packed_size(out);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        st->code = VRPC_RESOURCE_EXHAUSTED;
        snprintf(st->message, sizeof(st->message), "out of memory for a response of %zu bytes", len);
        return st->code;
    }
    protobuf_c_message_pack(out, buf);
    *resp = buf;
    *resp_len = len;
    return VRPC_OK;
}
