/* The conformance cases defined outside test_transport.c, listed for main(). */
#ifndef VRPC_TEST_TRANSPORT_CASES_H
#define VRPC_TEST_TRANSPORT_CASES_H

/* Entry point of the child process of the peer-crash case (re-executed). */
int peer_child_main(const char *backend, const char *uri);

void t_credits_burst(void **state);
void t_pipelined_sizes(void **state);
void t_many_connections(void **state);
void t_peer_close(void **state);
void t_close_delivers_queued(void **state);
void t_close_timeout(void **state);
void t_peer_crash(void **state);
void t_close_during_traffic(void **state);
void t_listener_close_pending(void **state);
/* reads, grants and revokes: skipped where the backend lacks grants */
void t_read_sizes(void **state);
void t_read_after_revoke(void **state);
void t_read_wrong_endpoint(void **state);
void t_read_past_buffer(void **state);
void t_read_tail_zeroed(void **state);
void t_reads_with_small_sends(void **state);
void t_revoke_during_read(void **state);
/* abortive close */
void t_abort(void **state);
/* vrpc_ep_send_list (send_list.c) */
void t_send_list_order(void **state);
void t_send_list_refused(void **state);

#define CONFORMANCE_CASES                                                                                              \
    cmocka_unit_test(t_credits_burst), cmocka_unit_test(t_pipelined_sizes), cmocka_unit_test(t_many_connections),      \
        cmocka_unit_test(t_peer_close), cmocka_unit_test(t_close_delivers_queued), cmocka_unit_test(t_close_timeout),  \
        cmocka_unit_test(t_peer_crash), cmocka_unit_test(t_close_during_traffic),                                      \
        cmocka_unit_test(t_listener_close_pending), cmocka_unit_test(t_read_sizes),                                    \
        cmocka_unit_test(t_read_after_revoke), cmocka_unit_test(t_read_wrong_endpoint),                                \
        cmocka_unit_test(t_read_past_buffer), cmocka_unit_test(t_read_tail_zeroed),                                    \
        cmocka_unit_test(t_reads_with_small_sends), cmocka_unit_test(t_revoke_during_read), cmocka_unit_test(t_abort), \
        cmocka_unit_test(t_send_list_order), cmocka_unit_test(t_send_list_refused),

/* Fair shares (fair.c): connection limit, credit timeout, eager minimum. */
void t_fair_max_conns(void **state);
void t_fair_credit_timeout(void **state);
void t_fair_eager_min(void **state);
void t_fair_shrink(void **state);

#define FAIR_CASES                                                                                                     \
    cmocka_unit_test(t_fair_max_conns), cmocka_unit_test(t_fair_credit_timeout), cmocka_unit_test(t_fair_eager_min),   \
        cmocka_unit_test(t_fair_shrink),

/* TCP only (bad_peer.c). */
void t_bad_garbage(void **state);
void t_bad_huge_header(void **state);
void t_bad_half_frame(void **state);
void t_bad_slow_peer(void **state);
void t_bad_read_requests(void **state);
void t_bad_read_frames(void **state);
void t_bad_read_owner(void **state);

#define BAD_PEER_CASES                                                                                                 \
    cmocka_unit_test(t_bad_garbage), cmocka_unit_test(t_bad_huge_header), cmocka_unit_test(t_bad_half_frame),          \
        cmocka_unit_test(t_bad_slow_peer), cmocka_unit_test(t_bad_read_requests), cmocka_unit_test(t_bad_read_frames), \
        cmocka_unit_test(t_bad_read_owner),

#endif
