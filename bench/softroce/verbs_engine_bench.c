/* verbs_engine_bench: ping-pong latency and one-way message rate of the verbs
 * backend's engine on a real device, to compare with perftest's ib_send_lat
 * and ib_send_bw on the same device (bench/softroce/run.sh does that in the
 * Soft-RoCE VM). The next ping is sent from the client's completion callback,
 * so two threads poll, as with perftest's two processes.
 *   verbs_engine_bench [--setup single|veth] [--iters N] [--size B] [--json] */
#include "transport/verbs/verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct side {
	struct vrpc_verbs_ctx *ctx;
	struct vrpc_verbs_cq *cq;
	struct vrpc_verbs_ep *ep;
};

static struct side g_cli, g_srv;
static uint32_t g_size = 32;
static int g_iters = 5000, g_warmup = 200;
static uint64_t *g_lat;
static atomic_int g_done_pp, g_recv_count;
static int g_mode; /* 0 ping-pong, 1 stream */
static uint64_t g_t0;
static int g_i;

static void send_size(struct side *s, struct vrpc_verbs_ep *ep)
{
	void *buf;
	while (vrpc_verbs_buf_get(s->ctx, &buf))
		sched_yield();
	memset(buf, 0x5a, g_size);
	while (vrpc_verbs_send(ep, buf, g_size, 0, 0) == -EAGAIN)
		sched_yield();
}

static void srv_cb(void *arg, const struct vrpc_verbs_wc *wc)
{
	(void)arg;
	if (wc->op == VRPC_VERBS_OP_SEND) {
		vrpc_verbs_buf_put(g_srv.ctx, wc->buf);
		return;
	}
	vrpc_verbs_recv_release(g_srv.cq, wc->buf);
	if (g_mode == 0)
		send_size(&g_srv, wc->ep);
	else
		atomic_fetch_add(&g_recv_count, 1);
}

static void cli_cb(void *arg, const struct vrpc_verbs_wc *wc)
{
	(void)arg;
	if (wc->op == VRPC_VERBS_OP_SEND) {
		vrpc_verbs_buf_put(g_cli.ctx, wc->buf);
		return;
	}
	vrpc_verbs_recv_release(g_cli.cq, wc->buf);
	if (g_mode != 0)
		return;
	uint64_t t = now_ns();
	if (g_i >= g_warmup)
		g_lat[g_i - g_warmup] = t - g_t0;
	if (++g_i == g_iters + g_warmup) {
		atomic_store(&g_done_pp, 1);
		return;
	}
	g_t0 = now_ns();
	send_size(&g_cli, g_cli.ep);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "verbs_engine_bench: %s: %s\n", what, strerror(-err));
	exit(1);
}

int main(int argc, char **argv)
{
	const char *setup = "single", *ipa, *ipb;
	struct vrpc_verbs_cfg cfg;
	struct vrpc_verbs_listener *l;
	struct sockaddr_in a = { .sin_family = AF_INET }, b = { .sin_family = AF_INET };
	char why[160];
	int json = 0, err, stream_n = 50000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--setup") && i + 1 < argc)
			setup = argv[++i];
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
			g_iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			g_size = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--json"))
			json = 1;
		else {
			fprintf(stderr, "usage: %s [--setup single|veth] [--iters N] [--size B] [--json]\n", argv[0]);
			return 2;
		}
	}
	ipa = getenv(strcmp(setup, "veth") ? "VRPC_VERBS_IP" : "VRPC_VERBS_IP_A");
	ipb = getenv(strcmp(setup, "veth") ? "VRPC_VERBS_IP" : "VRPC_VERBS_IP_B");
	if (!ipa || !ipb || inet_pton(AF_INET, ipa, &a.sin_addr) != 1 || inet_pton(AF_INET, ipb, &b.sin_addr) != 1) {
		fprintf(stderr, "verbs_engine_bench: set VRPC_VERBS_IP (or _A/_B for veth); see tests/softroce/run.sh\n");
		return 77;
	}
	vrpc_verbs_cfg_default(&cfg);
	cfg.busy_poll_us = 1000000; /* pollers spin, as perftest does */
	g_lat = calloc((size_t)g_iters, sizeof(*g_lat));
	if ((err = vrpc_verbs_ctx_create((struct sockaddr *)&b, &cfg, &g_srv.ctx)) ||
	    (err = vrpc_verbs_cq_create(g_srv.ctx, srv_cb, NULL, NULL, &g_srv.cq)) ||
	    (err = vrpc_verbs_ctx_create((struct sockaddr *)&a, &cfg, &g_cli.ctx)) ||
	    (err = vrpc_verbs_cq_create(g_cli.ctx, cli_cb, NULL, NULL, &g_cli.cq)))
		die("setup", err);
	if ((err = vrpc_verbs_listen(g_srv.ctx, g_srv.cq, (struct sockaddr *)&b, &l)))
		die("listen", err);
	b.sin_port = htons(vrpc_verbs_listener_port(l));
	if ((err = vrpc_verbs_connect(g_cli.ctx, g_cli.cq, (struct sockaddr *)&b, &g_cli.ep, why, sizeof(why))))
		die(why, err);
	if ((err = vrpc_verbs_accept(l, 10000, &g_srv.ep)))
		die("accept", err);

	/* ping-pong */
	g_t0 = now_ns();
	send_size(&g_cli, g_cli.ep);
	while (!atomic_load(&g_done_pp))
		usleep(1000);
	qsort(g_lat, (size_t)g_iters, sizeof(*g_lat), cmp_u64);
	double p50 = g_lat[g_iters / 2] / 1000.0, p99 = g_lat[(size_t)g_iters * 99 / 100] / 1000.0;
	double avg = 0;
	for (int i = 0; i < g_iters; i++)
		avg += g_lat[i] / 1000.0;
	avg /= g_iters;

	/* one-way stream: message rate */
	g_mode = 1;
	uint64_t t0 = now_ns();
	for (int i = 0; i < stream_n; i++)
		send_size(&g_cli, g_cli.ep);
	while (atomic_load(&g_recv_count) < stream_n)
		usleep(100);
	double secs = (now_ns() - t0) / 1e9, rate = stream_n / secs;

	if (json) {
		printf("{\"name\":\"verbs_engine:pingpong:%s:%uB\",\"ops_per_s\":%.0f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
		       "\"avg_us\":%.2f,\"half_rtt_p50_us\":%.2f,\"device\":\"%s\"}\n",
		       setup, g_size, 1e6 / avg, p50, p99, avg, p50 / 2, vrpc_verbs_ctx_device_name(g_cli.ctx));
		printf("{\"name\":\"verbs_engine:msgrate:%s:%uB\",\"ops_per_s\":%.0f,\"p50_us\":0,\"p99_us\":0}\n", setup,
		       g_size, rate);
	} else {
		printf("verbs engine ping-pong %s %u B: round trip p50 %.2f us (half: %.2f), p99 %.2f us, avg %.2f us\n",
		       setup, g_size, p50, p50 / 2, p99, avg);
		printf("verbs engine message rate %s %u B: %.0f msg/s\n", setup, g_size, rate);
	}
	vrpc_verbs_ep_close(g_cli.ep);
	vrpc_verbs_ep_close(g_srv.ep);
	vrpc_verbs_listener_destroy(l);
	vrpc_verbs_cq_destroy(g_cli.cq);
	vrpc_verbs_cq_destroy(g_srv.cq);
	vrpc_verbs_ctx_destroy(g_cli.ctx);
	vrpc_verbs_ctx_destroy(g_srv.ctx);
	free(g_lat);
	return 0;
}
