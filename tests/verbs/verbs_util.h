/* Helpers for the verbs-only tests: addresses from the environment (set by
 * tests/softroce/run.sh, or by the user on a machine with an RDMA device), a
 * completion collector fed by a CQ's poller, and waits with deadlines. */
#ifndef VRPC_TESTS_VERBS_UTIL_H
#define VRPC_TESTS_VERBS_UTIL_H

#include "transport/verbs/verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "verbs_setup.h"

#define SKIP_CODE 77

/* Addresses of the set-up: "single" (one device: VRPC_VERBS_IP for both
 * sides) or "veth" (client VRPC_VERBS_IP_A, server VRPC_VERBS_IP_B).
 * Exits 77 with a message when they are not set. */
struct vt_setup {
	struct sockaddr_in client, server;
};

static inline void vt_setup_from_env(const char *setup, struct vt_setup *s)
{
	const char *a = NULL, *b = NULL;
	int rc = vrpc_test_verbs_addrs(setup, &b, &a);
	if (rc)
		exit(rc == -ENOENT ? SKIP_CODE : 2);
	memset(s, 0, sizeof(*s));
	s->client.sin_family = s->server.sin_family = AF_INET;
	if (inet_pton(AF_INET, a, &s->client.sin_addr) != 1 || inet_pton(AF_INET, b, &s->server.sin_addr) != 1) {
		fprintf(stderr, "bad address in the environment: %s / %s\n", a, b);
		exit(2);
	}
}

/* Completions collected from a poller, consumed by the test thread. */
#define VT_MAXWC 65536
struct vt_sink {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct vrpc_verbs_wc wc[VT_MAXWC];
	unsigned head, tail;
	unsigned errors; /* endpoint error callbacks */
	int last_err;
	char last_why[128];
};

static inline void vt_sink_init(struct vt_sink *k)
{
	memset(k, 0, sizeof(*k));
	pthread_mutex_init(&k->lock, NULL);
	pthread_cond_init(&k->cond, NULL);
}

static inline void vt_on_wc(void *arg, const struct vrpc_verbs_wc *wc)
{
	struct vt_sink *k = arg;
	pthread_mutex_lock(&k->lock);
	if (k->tail - k->head < VT_MAXWC)
		k->wc[k->tail++ % VT_MAXWC] = *wc;
	else
		fprintf(stderr, "vt_sink overflow\n");
	pthread_cond_broadcast(&k->cond);
	pthread_mutex_unlock(&k->lock);
}

static inline void vt_on_err(void *arg, struct vrpc_verbs_ep *ep, int err, const char *why)
{
	struct vt_sink *k = arg;
	(void)ep;
	pthread_mutex_lock(&k->lock);
	k->errors++;
	k->last_err = err;
	snprintf(k->last_why, sizeof(k->last_why), "%s", why);
	pthread_cond_broadcast(&k->cond);
	pthread_mutex_unlock(&k->lock);
}

static inline void vt_deadline(struct timespec *dl, int ms)
{
	clock_gettime(CLOCK_REALTIME, dl);
	dl->tv_sec += ms / 1000;
	dl->tv_nsec += (long)(ms % 1000) * 1000000;
	if (dl->tv_nsec >= 1000000000) {
		dl->tv_sec++;
		dl->tv_nsec -= 1000000000;
	}
}

/* Takes the next completion; -ETIMEDOUT after ms. */
static inline int vt_next(struct vt_sink *k, struct vrpc_verbs_wc *out, int ms)
{
	struct timespec dl;
	int err = 0;
	vt_deadline(&dl, ms);
	pthread_mutex_lock(&k->lock);
	while (k->head == k->tail && !err)
		if (pthread_cond_timedwait(&k->cond, &k->lock, &dl) == ETIMEDOUT)
			err = -ETIMEDOUT;
	if (k->head != k->tail) {
		*out = k->wc[k->head++ % VT_MAXWC];
		err = 0;
	}
	pthread_mutex_unlock(&k->lock);
	return err;
}

static inline uint32_t vt_sum(const unsigned char *p, uint32_t n)
{
	uint32_t h = 2166136261u;
	for (uint32_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

/* Reads a counter of the device's port 1 (rxe: hw_counters), -1 if absent. */
static inline long vt_hw_counter(const char *dev, const char *name)
{
	char path[256];
	long v = -1;
	FILE *f;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/hw_counters/%s", dev, name);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%ld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

#endif
