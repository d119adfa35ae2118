/* Private to transport/: the disconnect-status rule every backend applies
 * (docs/ARCHITECTURE.md, "A connection's DISCONNECTED status tells a close
 * from a loss"; include/verbrpc/transport.h). A backend supplies the facts of
 * its medium, the rule is here once. */
#ifndef VRPC_TRANSPORT_DISCONNECT_H
#define VRPC_TRANSPORT_DISCONNECT_H

#include <errno.h>
#include <stdbool.h>

/* The status of a connection's DISCONNECTED completion, settled on its
 * poller once every completion of the connection was polled:
 *   status   what the connection failed with so far (0: nothing failed);
 *   by_peer  the peer ended it (verbs: a DREQ; TCP: a FIN between frames);
 *   err      the first error completion of ours that is not a flush (a READ
 *            refused: -EACCES), 0 if none;
 *   cut_off  the peer's end cut off work of ours (a send not acknowledged, a
 *            read not answered, a window operation).
 * Unless the peer ended it, status stands. Otherwise an error completion
 * wins; else a disconnect that cut our work off is a loss (-ECONNRESET, a
 * closing peer serves our work first); only one with nothing of ours under
 * way is a close (status, 0). The caller logs the reason when the result is
 * not status. Any thread; no lock (pure). */
static inline int vrpc_tp_disc_status(int status, bool by_peer, int err, bool cut_off)
{
    if (!by_peer)
        return status;
    if (err && err != status)
        return err;
    if (!status && cut_off)
        return -ECONNRESET;
    return status;
}

#endif
