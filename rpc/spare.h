/* Spare lists of message nodes (private header): a stream keeps the nodes
 * it is done with on a singly linked list and takes one back for the next
 * message of a size that fits, so a steady stream allocates nothing per
 * message. A stream's messages are mostly of one size: only the first
 * VRPC_SPARE_LOOK nodes are looked at, so a take costs a few loads however
 * long the list. Node types: any struct with members `next` (its own
 * pointer type) and `cap` (bytes of data). Caller holds the list's lock. */
#ifndef VRPC_RPC_SPARE_H
#define VRPC_RPC_SPARE_H

#include <stdlib.h>

#define VRPC_SPARE_LOOK 4
/* Smallest data size of a new node: small messages share one size. */
#define VRPC_SPARE_MIN_CAP 256u

/* out = the first of the first VRPC_SPARE_LOOK nodes of the list at head
 * (type **) with cap >= len, unlinked from it; NULL if none fits. */
#define VRPC_SPARE_TAKE(type, head, len, out)                                                                          \
    do {                                                                                                               \
        type **spare_pp_ = (head);                                                                                     \
        (out) = NULL;                                                                                                  \
        for (int spare_i_ = 0; *spare_pp_ && spare_i_ < VRPC_SPARE_LOOK;                                               \
             spare_pp_ = &(*spare_pp_)->next, spare_i_++)                                                              \
            if ((*spare_pp_)->cap >= (len)) {                                                                          \
                (out) = *spare_pp_;                                                                                    \
                *spare_pp_ = (out)->next;                                                                              \
                break;                                                                                                 \
            }                                                                                                          \
    } while (0)

/* As VRPC_SPARE_TAKE, else a new node (malloc, data after the struct) of
 * cap max(len, VRPC_SPARE_MIN_CAP); out NULL only when out of memory. */
#define VRPC_SPARE_GET(type, head, len, out)                                                                           \
    do {                                                                                                               \
        VRPC_SPARE_TAKE(type, head, len, out);                                                                         \
        if (!(out)) {                                                                                                  \
            uint32_t spare_cap_ = (len) < VRPC_SPARE_MIN_CAP ? VRPC_SPARE_MIN_CAP : (len);                            \
            (out) = malloc(sizeof(type) + spare_cap_);                                                                 \
            if (out)                                                                                                   \
                (out)->cap = spare_cap_;                                                                               \
        }                                                                                                              \
    } while (0)

#endif
