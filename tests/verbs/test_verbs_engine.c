/* Verbs-only tests of the verbs backend on a real device (Soft-RoCE in the
 * VM): RNR-free bursts with rnr_retry 0, 200 connections on one shared
 * receive queue with flat registered memory, exactly-once flush when the
 * peer is killed, reconnect after a server restart, and a clear rejection of
 * a wrong protocol version.
 *   test_verbs_engine --setup single|veth     (addresses from VRPC_VERBS_IP*) */
#include "tests/verbs/verbs_util.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static struct vt_setup g_setup;
static const char *g_setup_name = "single";

struct side {
	struct vrpc_verbs_ctx *ctx;
	struct vrpc_verbs_cq *cq;
	struct vt_sink sink;
};

static void test_cfg(struct vrpc_verbs_cfg *cfg)
{
	vrpc_verbs_cfg_default(cfg);
	cfg->rnr_retry = 0; /* credits must make RNR impossible */
}

static void side_open(struct side *s, const struct sockaddr_in *addr, const struct vrpc_verbs_cfg *cfg)
{
	vt_sink_init(&s->sink);
	assert_int_equal(vrpc_verbs_ctx_create((const struct sockaddr *)addr, cfg, &s->ctx), 0);
	assert_int_equal(vrpc_verbs_cq_create(s->ctx, vt_on_wc, vt_on_err, &s->sink, &s->cq), 0);
}

static void side_close(struct side *s)
{
	vrpc_verbs_cq_destroy(s->cq);
	vrpc_verbs_ctx_destroy(s->ctx);
}

/* Pops completions until one of `op` arrives; send completions met on the
 * way give their buffer back. */
static int wait_op(struct side *s, enum vrpc_verbs_op op, struct vrpc_verbs_wc *out, int ms)
{
	for (;;) {
		struct vrpc_verbs_wc wc = { 0 };
		int err = vt_next(&s->sink, &wc, ms);
		if (err)
			return err;
		if (wc.op == op) {
			*out = wc;
			return 0;
		}
		if (wc.op == VRPC_VERBS_OP_SEND)
			vrpc_verbs_buf_put(s->ctx, wc.buf);
		else
			vrpc_verbs_recv_release(s->cq, wc.buf);
	}
}

static int send_bytes(struct side *s, struct vrpc_verbs_ep *ep, const void *data, uint32_t len, uint64_t id)
{
	void *buf;
	int err = vrpc_verbs_buf_get(s->ctx, &buf);
	if (err)
		return err;
	memcpy(buf, data, len);
	err = vrpc_verbs_send(ep, buf, len, vt_sum(buf, len), id);
	if (err)
		vrpc_verbs_buf_put(s->ctx, buf);
	return err;
}

static struct sockaddr_in with_port(struct sockaddr_in a, uint16_t port)
{
	a.sin_port = htons(port);
	return a;
}

static const char *counter_dev(struct side *s) { return vrpc_verbs_ctx_device_name(s->ctx); }

static long rnr_counters(struct side *a, struct side *b)
{
	static const char *names[] = { "rcvd_rnr_err", "send_rnr_err", "rnr_nak_retry_err" };
	long sum = 0;
	for (size_t i = 0; i < 3; i++) {
		long x = vt_hw_counter(counter_dev(a), names[i]), y = vt_hw_counter(counter_dev(b), names[i]);
		sum += (x > 0 ? x : 0) + (y > 0 && strcmp(counter_dev(a), counter_dev(b)) ? y : 0);
	}
	return sum;
}

/* One client, one server, connected. */
struct pair {
	struct side cli, srv;
	struct vrpc_verbs_listener *l;
	struct vrpc_verbs_ep *cep, *sep;
};

static void pair_open(struct pair *p)
{
	struct vrpc_verbs_cfg cfg;
	struct sockaddr_in any = with_port(g_setup.server, 0), dst;
	char why[160];
	test_cfg(&cfg);
	side_open(&p->srv, &g_setup.server, &cfg);
	side_open(&p->cli, &g_setup.client, &cfg);
	assert_int_equal(vrpc_verbs_listen(p->srv.ctx, p->srv.cq, (struct sockaddr *)&any, &p->l), 0);
	dst = with_port(g_setup.server, vrpc_verbs_listener_port(p->l));
	assert_int_equal(vrpc_verbs_connect(p->cli.ctx, p->cli.cq, (struct sockaddr *)&dst, &p->cep, why, sizeof(why)), 0);
	assert_int_equal(vrpc_verbs_accept(p->l, 10000, &p->sep), 0);
}

static void pair_close(struct pair *p)
{
	vrpc_verbs_ep_close(p->cep);
	vrpc_verbs_ep_close(p->sep);
	vrpc_verbs_listener_destroy(p->l);
	side_close(&p->cli);
	side_close(&p->srv);
}

/* Echo of every size 0..eager with checksums carried in the immediate. */
static void test_pingpong_sizes(void **state)
{
	struct pair p;
	static unsigned char data[4096];
	(void)state;
	pair_open(&p);
	static const uint32_t big[] = { 100, 255, 256, 1000, 1023, 1024, 1025, 2047, 2048, 3000, 4095, 4096 };
	for (uint32_t k = 0; k < 65 + sizeof(big) / sizeof(big[0]); k++) {
		uint32_t n = k < 65 ? k : big[k - 65];
		struct vrpc_verbs_wc wc = { 0 };
		for (uint32_t i = 0; i < n; i++)
			data[i] = (unsigned char)(i * 7 + n);
		assert_int_equal(send_bytes(&p.cli, p.cep, data, n, n), 0);
		assert_int_equal(wait_op(&p.srv, VRPC_VERBS_OP_RECV, &wc, 10000), 0);
		assert_int_equal(wc.status, 0);
		assert_int_equal(wc.byte_len, n);
		assert_int_equal(wc.imm, vt_sum(wc.buf, n));
		assert_ptr_equal(wc.ep, p.sep);
		assert_int_equal(send_bytes(&p.srv, p.sep, wc.buf, n, n), 0);
		vrpc_verbs_recv_release(p.srv.cq, wc.buf);
		assert_int_equal(wait_op(&p.cli, VRPC_VERBS_OP_RECV, &wc, 10000), 0);
		assert_int_equal(wc.byte_len, n);
		assert_memory_equal(wc.buf, data, n);
		vrpc_verbs_recv_release(p.cli.cq, wc.buf);
	}
	pair_close(&p);
}

/* A one-way burst far larger than the window, with rnr_retry 0: any RNR
 * would fail the QP. Nothing lost, order kept, no RNR counted. */
static void test_rnr_burst(void **state)
{
	struct pair p;
	const uint32_t N = 20000;
	uint32_t sent = 0, got = 0;
	long rnr0;
	(void)state;
	pair_open(&p);
	rnr0 = rnr_counters(&p.cli, &p.srv);
	while (got < N) {
		struct vrpc_verbs_wc wc = { 0 };
		while (sent < N) {
			int err = send_bytes(&p.cli, p.cep, &sent, sizeof(sent), sent);
			if (err == -EAGAIN || err == -ENOBUFS)
				break;
			assert_int_equal(err, 0);
			sent++;
		}
		/* give send buffers back */
		pthread_mutex_lock(&p.cli.sink.lock);
		while (p.cli.sink.head != p.cli.sink.tail) {
			wc = p.cli.sink.wc[p.cli.sink.head++ % VT_MAXWC];
			assert_int_equal(wc.status, 0);
			vrpc_verbs_buf_put(p.cli.ctx, wc.buf);
		}
		pthread_mutex_unlock(&p.cli.sink.lock);
		while (vt_next(&p.srv.sink, &wc, got < sent ? 10000 : 1) == 0) {
			uint32_t v;
			assert_int_equal(wc.op, VRPC_VERBS_OP_RECV);
			assert_int_equal(wc.status, 0);
			memcpy(&v, wc.buf, sizeof(v));
			assert_int_equal(v, got);
			got++;
			vrpc_verbs_recv_release(p.srv.cq, wc.buf);
			if (got == sent)
				break;
		}
	}
	assert_int_equal(vrpc_verbs_ep_error(p.cep), 0);
	assert_int_equal(p.cli.sink.errors + p.srv.sink.errors, 0);
	assert_int_equal(rnr_counters(&p.cli, &p.srv), rnr0);
	pair_close(&p);
}

/* 200 connections on one CQ per side: one SRQ serves all, and the registered
 * memory does not grow with the number of connections. */
static void test_many_connections(void **state)
{
	enum { NCONN = 200 };
	struct vrpc_verbs_cfg cfg;
	struct side cli, srv;
	struct vrpc_verbs_listener *l;
	struct vrpc_verbs_ep **ceps = calloc(NCONN, sizeof(*ceps)), **seps = calloc(NCONN, sizeof(*seps));
	struct sockaddr_in any = with_port(g_setup.server, 0), dst;
	size_t reg_cli, reg_srv;
	char why[160];
	(void)state;
	test_cfg(&cfg);
	side_open(&srv, &g_setup.server, &cfg);
	side_open(&cli, &g_setup.client, &cfg);
	reg_cli = vrpc_verbs_ctx_registered_bytes(cli.ctx);
	reg_srv = vrpc_verbs_ctx_registered_bytes(srv.ctx);
	assert_true(reg_cli > 0);
	assert_int_equal(vrpc_verbs_listen(srv.ctx, srv.cq, (struct sockaddr *)&any, &l), 0);
	dst = with_port(g_setup.server, vrpc_verbs_listener_port(l));
	for (int i = 0; i < NCONN; i++) {
		assert_int_equal(vrpc_verbs_connect(cli.ctx, cli.cq, (struct sockaddr *)&dst, &ceps[i], why, sizeof(why)), 0);
		assert_int_equal(vrpc_verbs_accept(l, 10000, &seps[i]), 0);
	}
	assert_int_equal(vrpc_verbs_ctx_registered_bytes(cli.ctx), reg_cli);
	assert_int_equal(vrpc_verbs_ctx_registered_bytes(srv.ctx), reg_srv);
	printf("# %d connections: registered %zu bytes (client), %zu bytes (server), unchanged\n", NCONN, reg_cli,
	       reg_srv);
	/* every connection carries a message through the one receive queue */
	for (uint32_t i = 0; i < NCONN; i++)
		assert_int_equal(send_bytes(&cli, ceps[i], &i, sizeof(i), i), 0);
	for (uint32_t i = 0; i < NCONN; i++) {
		struct vrpc_verbs_wc wc = { 0 };
		uint32_t v;
		assert_int_equal(wait_op(&srv, VRPC_VERBS_OP_RECV, &wc, 20000), 0);
		memcpy(&v, wc.buf, sizeof(v));
		assert_true(v < NCONN);
		assert_ptr_equal(wc.ep, seps[v]);
		vrpc_verbs_recv_release(srv.cq, wc.buf);
	}
	for (int i = 0; i < NCONN; i++) {
		vrpc_verbs_ep_close(ceps[i]);
		vrpc_verbs_ep_close(seps[i]);
	}
	vrpc_verbs_listener_destroy(l);
	side_close(&cli);
	side_close(&srv);
	free(ceps);
	free(seps);
}

/* Children are fresh processes (fork + exec of this program): a forked copy
 * would share the parent's device contexts, which librdmacm opens once per
 * process, so killing it would not tear its queue pairs down. */
static pid_t g_children[8];

static pid_t spawn(const char *role, uint16_t port, int *ready_rd)
{
	int pfd[2];
	char portstr[16], fdstr[16];
	pid_t pid;
	assert_int_equal(pipe(pfd), 0);
	snprintf(portstr, sizeof(portstr), "%u", port);
	snprintf(fdstr, sizeof(fdstr), "%d", pfd[1]);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(pfd[0]);
		prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
		execl("/proc/self/exe", "test_verbs_engine", "--setup", g_setup_name, role, portstr, fdstr, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	for (size_t i = 0; i < sizeof(g_children) / sizeof(g_children[0]); i++)
		if (!g_children[i]) {
			g_children[i] = pid;
			break;
		}
	*ready_rd = pfd[0];
	return pid;
}

static void reap(pid_t pid)
{
	int status;
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	for (size_t i = 0; i < sizeof(g_children) / sizeof(g_children[0]); i++)
		if (g_children[i] == pid)
			g_children[i] = 0;
}

/* Group teardown: no child may outlive a failed test (it would hold ctest's
 * output pipe open). */
static int kill_children(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(g_children) / sizeof(g_children[0]); i++)
		if (g_children[i])
			reap(g_children[i]);
	return 0;
}

/* Child: connects to port and sends `n` messages, then waits to be killed.
 * Never returns. */
static void child_client(uint16_t port, int n, int ready_fd)
{
	struct vrpc_verbs_cfg cfg;
	struct side c;
	struct vrpc_verbs_ep *ep = NULL;
	struct sockaddr_in dst = with_port(g_setup.server, port);
	char why[160];
	char ok = 1;
	test_cfg(&cfg);
	vt_sink_init(&c.sink);
	if (vrpc_verbs_ctx_create((struct sockaddr *)&g_setup.client, &cfg, &c.ctx) ||
	    vrpc_verbs_cq_create(c.ctx, vt_on_wc, vt_on_err, &c.sink, &c.cq))
		_exit(3);
	if (vrpc_verbs_connect(c.ctx, c.cq, (struct sockaddr *)&dst, &ep, why, sizeof(why))) {
		fprintf(stderr, "child: connect: %s\n", why);
		_exit(4);
	}
	for (int i = 0; i < n; i++)
		send_bytes(&c, ep, &i, sizeof(i), (uint64_t)i);
	if (write(ready_fd, &ok, 1) != 1)
		_exit(5);
	for (;;)
		pause();
}

/* The peer is killed with SIGKILL while this side has sends posted and
 * queued: the endpoint fails with a clear error and every send completes
 * exactly once. */
static void test_sigkill_flush(void **state)
{
	enum { NSEND = 60 };
	struct vrpc_verbs_cfg cfg;
	struct side srv;
	struct vrpc_verbs_listener *l;
	struct vrpc_verbs_ep *ep;
	struct sockaddr_in any = with_port(g_setup.server, 0);
	unsigned char seen[NSEND] = { 0 };
	int pfd[1], done = 0, flushed = 0;
	char c;
	pid_t pid;
	(void)state;
	test_cfg(&cfg);
	side_open(&srv, &g_setup.server, &cfg);
	assert_int_equal(vrpc_verbs_listen(srv.ctx, srv.cq, (struct sockaddr *)&any, &l), 0);
	pid = spawn("--child-client", vrpc_verbs_listener_port(l), &pfd[0]);
	assert_int_equal(vrpc_verbs_accept(l, 20000, &ep), 0);
	assert_int_equal(read(pfd[0], &c, 1), 1);
	close(pfd[0]);
	/* the child never releases its receive buffers: sends beyond its window
	 * stay queued here */
	for (uint32_t i = 0; i < NSEND; i++)
		assert_int_equal(send_bytes(&srv, ep, &i, sizeof(i), i), 0);
	usleep(200000);
	reap(pid);
	while (done < NSEND) {
		struct vrpc_verbs_wc wc = { 0 };
		assert_int_equal(vt_next(&srv.sink, &wc, 30000), 0);
		if (wc.op == VRPC_VERBS_OP_RECV) {
			vrpc_verbs_recv_release(srv.cq, wc.buf);
			continue;
		}
		assert_true(wc.wr_id < NSEND);
		assert_int_equal(seen[wc.wr_id], 0); /* exactly once */
		seen[wc.wr_id] = 1;
		if (wc.status)
			flushed++;
		vrpc_verbs_buf_put(srv.ctx, wc.buf);
		done++;
	}
	assert_true(flushed > 0);
	assert_int_not_equal(vrpc_verbs_ep_error(ep), 0);
	assert_int_equal(srv.sink.errors, 1);
	printf("# peer killed: %d sends completed, %d flushed; error: %s\n", done, flushed, srv.sink.last_why);
	/* nothing more arrives for it */
	{
		struct vrpc_verbs_wc wc = { 0 };
		while (vt_next(&srv.sink, &wc, 500) == 0)
			assert_int_equal(wc.op, VRPC_VERBS_OP_RECV);
	}
	vrpc_verbs_ep_close(ep);
	vrpc_verbs_listener_destroy(l);
	side_close(&srv);
}

/* Child: a server on `port` that echoes until killed. Never returns. */
static void child_server(uint16_t port, int ready_fd)
{
	struct vrpc_verbs_cfg cfg;
	struct side s;
	struct vrpc_verbs_listener *l;
	struct sockaddr_in addr = with_port(g_setup.server, port);
	char ok = 1;
	test_cfg(&cfg);
	vt_sink_init(&s.sink);
	if (vrpc_verbs_ctx_create((struct sockaddr *)&g_setup.server, &cfg, &s.ctx) ||
	    vrpc_verbs_cq_create(s.ctx, vt_on_wc, vt_on_err, &s.sink, &s.cq))
		_exit(3);
	if (vrpc_verbs_listen(s.ctx, s.cq, (struct sockaddr *)&addr, &l))
		_exit(4);
	if (write(ready_fd, &ok, 1) != 1)
		_exit(5);
	for (;;) {
		struct vrpc_verbs_wc wc = { 0 };
		struct vrpc_verbs_ep *ep;
		while (vrpc_verbs_accept(l, 0, &ep) == 0)
			; /* kept open until the process dies */
		if (vt_next(&s.sink, &wc, 100))
			continue;
		if (wc.op == VRPC_VERBS_OP_SEND) {
			vrpc_verbs_buf_put(s.ctx, wc.buf);
		} else {
			send_bytes(&s, wc.ep, wc.buf, wc.byte_len, 0);
			vrpc_verbs_recv_release(s.cq, wc.buf);
		}
	}
}

static pid_t start_server(uint16_t port)
{
	int rd;
	char c;
	pid_t pid = spawn("--child-server", port, &rd);
	assert_int_equal(read(rd, &c, 1), 1);
	close(rd);
	return pid;
}

static void echo_once(struct side *cli, struct vrpc_verbs_ep *ep, uint32_t v)
{
	struct vrpc_verbs_wc wc = { 0 };
	uint32_t back;
	assert_int_equal(send_bytes(cli, ep, &v, sizeof(v), v), 0);
	assert_int_equal(wait_op(cli, VRPC_VERBS_OP_RECV, &wc, 20000), 0);
	memcpy(&back, wc.buf, sizeof(back));
	assert_int_equal(back, v);
	vrpc_verbs_recv_release(cli->cq, wc.buf);
}

/* The server process dies and a new one starts on the same port: the client
 * sees its endpoint fail, then reconnects cleanly. */
static void test_server_restart(void **state)
{
	struct vrpc_verbs_cfg cfg;
	struct side cli;
	struct vrpc_verbs_ep *ep;
	uint16_t port = (uint16_t)(20000 + getpid() % 20000);
	struct sockaddr_in dst = with_port(g_setup.server, port);
	char why[160];
	pid_t pid;
	int err = -1;
	(void)state;
	pid = start_server(port);
	test_cfg(&cfg);
	side_open(&cli, &g_setup.client, &cfg);
	assert_int_equal(vrpc_verbs_connect(cli.ctx, cli.cq, (struct sockaddr *)&dst, &ep, why, sizeof(why)), 0);
	echo_once(&cli, ep, 1);
	reap(pid);
	for (int i = 0; i < 300 && !vrpc_verbs_ep_error(ep); i++)
		usleep(20000);
	assert_int_not_equal(vrpc_verbs_ep_error(ep), 0);
	printf("# after the server died: %s\n", cli.sink.last_why);
	vrpc_verbs_ep_close(ep);

	pid = start_server(port);
	for (int i = 0; i < 50 && err; i++) {
		err = vrpc_verbs_connect(cli.ctx, cli.cq, (struct sockaddr *)&dst, &ep, why, sizeof(why));
		if (err)
			usleep(100000);
	}
	assert_int_equal(err, 0);
	echo_once(&cli, ep, 2);
	vrpc_verbs_ep_close(ep);
	reap(pid);
	side_close(&cli);
}

/* A client speaking another protocol version is rejected, with the reason
 * on both sides (the server logs it; the client's error carries it). */
static void test_wrong_version(void **state)
{
	struct vrpc_verbs_cfg cfg, bad;
	struct side cli, srv;
	struct vrpc_verbs_listener *l;
	struct vrpc_verbs_ep *ep = NULL;
	struct sockaddr_in any = with_port(g_setup.server, 0), dst;
	char why[160] = "";
	(void)state;
	test_cfg(&cfg);
	bad = cfg;
	bad.proto_version = 99;
	side_open(&srv, &g_setup.server, &cfg);
	side_open(&cli, &g_setup.client, &bad);
	assert_int_equal(vrpc_verbs_listen(srv.ctx, srv.cq, (struct sockaddr *)&any, &l), 0);
	dst = with_port(g_setup.server, vrpc_verbs_listener_port(l));
	assert_int_equal(vrpc_verbs_connect(cli.ctx, cli.cq, (struct sockaddr *)&dst, &ep, why, sizeof(why)), -EPROTO);
	printf("# client error: %s\n", why);
	assert_non_null(strstr(why, "protocol version 99 not supported"));
	assert_int_equal(vrpc_verbs_accept(l, 200, &ep), -ETIMEDOUT);
	/* a closed port is refused, with its own message */
	vrpc_verbs_listener_destroy(l);
	side_close(&cli);
	side_open(&cli, &g_setup.client, &cfg);
	assert_int_equal(vrpc_verbs_connect(cli.ctx, cli.cq, (struct sockaddr *)&dst, &ep, why, sizeof(why)),
			 -ECONNREFUSED);
	printf("# closed port: %s\n", why);
	side_close(&cli);
	side_close(&srv);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pingpong_sizes), cmocka_unit_test(test_wrong_version),
		cmocka_unit_test(test_rnr_burst),      cmocka_unit_test(test_sigkill_flush),
		cmocka_unit_test(test_server_restart), cmocka_unit_test(test_many_connections),
	};
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--setup") && i + 1 < argc)
			g_setup_name = argv[++i];
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			cmocka_set_test_filter(argv[++i]);
	}
	vt_setup_from_env(g_setup_name, &g_setup);
	signal(SIGPIPE, SIG_IGN);
	/* child roles: --child-server PORT FD / --child-client PORT FD */
	for (int i = 1; i + 2 < argc; i++) {
		if (!strcmp(argv[i], "--child-server"))
			child_server((uint16_t)atoi(argv[i + 1]), atoi(argv[i + 2]));
		if (!strcmp(argv[i], "--child-client"))
			child_client((uint16_t)atoi(argv[i + 1]), 5, atoi(argv[i + 2]));
	}
	return cmocka_run_group_tests_name(g_setup_name, tests, NULL, kill_children);
}
