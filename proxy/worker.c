/*
 * worker.c - one thread, one event loop (see worker.h).
 *
 * The main thread talks to a worker only through two atomics (next_cfg,
 * stop) and a write to w->notify_fd, and learns that its loop ended from a
 * third (exited); everything else in struct worker is touched by the
 * worker's own thread alone (and by the main thread before the thread
 * starts and after it is joined).
 *
 * The loop's base has no lock (EVENT_BASE_FLAG_NOLOCK): no other thread
 * may add, delete or activate its events. With the lock, every event_add,
 * event_del and event_active took and released a mutex, about 36 pairs in
 * a keep-alive request (docs/benchmarks.md "The workers' loops lose their
 * lock"). What other threads must wake here goes through an eventfd: this
 * notify_fd, and the memory store's mailbox (store_memory.c).
 */
#include "worker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "clock.h"
#include "config.h"
#include "conn.h"
#include "log.h"
#include "pp_accept.h"

/* After accept() fails for lack of descriptors, try again this much later. */
#define ACCEPT_RETRY_MS 100

/*
 * Connections taken from a listening socket per loop turn. On a TLS
 * listener one, as nginx does by default (multi_accept off): a burst of new
 * connections is then taken over as many turns, each turn also serving the
 * connections already open, instead of one turn starting every handshake of
 * the burst (about 400 us of CPU each) while the requests of connections
 * whose handshake is done wait behind them. A plain connection costs little
 * before its request, so more are taken at once. The rest wait in the
 * kernel's backlog, and epoll reports the socket again on the next turn.
 */
#define ACCEPT_PER_TURN_TLS 1
#define ACCEPT_PER_TURN_PLAIN 16

/* Start or stop accepting on every listening socket. */
static void listeners_enable(struct worker *w, bool on)
{
	for (int i = 0; i < w->nlisten; i++) {
		if (w->listeners[i] == NULL)
			continue;
		if (on)
			event_add(w->listeners[i], NULL);
		else
			event_del(w->listeners[i]);
	}
}

/* Close every listening socket (draining, or the end). */
static void listeners_free(struct worker *w)
{
	for (int i = 0; i < w->nlisten; i++) {
		if (w->listeners[i] != NULL)
			event_free(w->listeners[i]);
		if (w->listen_fds[i] >= 0)
			evutil_closesocket(w->listen_fds[i]);
		w->listeners[i] = NULL;
		w->listen_fds[i] = -1;
	}
}

/* Free closed connections, then see whether the loop can end. */
static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct conn *c;

	while ((c = TAILQ_FIRST(&w->loop.reap)) != NULL) {
		conn_free(c);
		w->nconns--;
	}
	if (w->listener_paused && !w->draining &&
	    w->nconns < w->loop.cfg->max_connections) {
		w->listener_paused = false;
		listeners_enable(w, true);
	}
	if (w->draining && w->nconns == 0 && w->loop.idem.norphans == 0)
		event_base_loopexit(w->loop.base, NULL);
}

/* One accepted connection: set it up, pause at max_connections. */
static void admit_conn(void *arg, evutil_socket_t fd,
		       const struct sockaddr *peer, socklen_t peerlen)
{
	struct worker *w = arg;

	if (conn_new(&w->loop, fd, peer, peerlen) == NULL) {
		log_warn("worker %d: cannot set up a connection", w->id);
		return;
	}
	w->nconns++;
	if (w->nconns >= w->loop.cfg->max_connections && !w->listener_paused) {
		log_warn("worker %d: max_connections (%d) reached, pausing accept",
			 w->id, w->loop.cfg->max_connections);
		w->listener_paused = true;
		listeners_enable(w, false);
	}
}

/* An accepted socket: a connection, once a load balancer in front has
 * named the client (--proxy-protocol, pp_accept.c). */
static void take_conn(struct worker *w, evutil_socket_t fd,
		      const struct sockaddr *peer, socklen_t peerlen)
{
	if (pp_accept_expected(&w->loop, peer))
		pp_accept_start(&w->loop, fd, peer, peerlen, admit_conn, w);
	else
		admit_conn(w, fd, peer, peerlen);
}

/*
 * accept() failed for lack of descriptors or memory (EMFILE, ENFILE,
 * ENOBUFS, ENOMEM), or for a reason not known to pass: back off briefly
 * instead of spinning on a listener that stays readable.
 */
static void accept_failed(struct worker *w, int err)
{
	struct timeval tv = { 0, ACCEPT_RETRY_MS * 1000 };

	log_warn("worker %d: accept: %s", w->id, strerror(err));
	listeners_enable(w, false);
	evtimer_add(w->accept_retry, &tv);
}

/*
 * Nothing left to take, or one connection that failed before it was taken
 * (accept(2): errors already pending on the new socket, a firewall's
 * EPERM): the listener reports again if more wait. Anything else backs off.
 */
static bool accept_passing(int err)
{
	switch (err) {
	case EAGAIN:
#if EWOULDBLOCK != EAGAIN
	case EWOULDBLOCK:
#endif
	case EINTR:
	case ECONNABORTED:
	case EPROTO:
	case EPERM:
	case ENETDOWN:
	case ENETUNREACH:
	case ENOPROTOOPT:
	case EHOSTDOWN:
	case EHOSTUNREACH:
	case ENONET:
	case EOPNOTSUPP:
		return true;
	default:
		return false;
	}
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
	struct worker *w = arg;
	int budget = w->loop.tls != NULL ? ACCEPT_PER_TURN_TLS
					 : ACCEPT_PER_TURN_PLAIN;

	for (int n = 0; n < budget && !w->listener_paused; n++) {
		struct sockaddr_storage ss;
		socklen_t sslen = sizeof(ss);
		evutil_socket_t fd = accept4(lfd, (struct sockaddr *)&ss, &sslen,
					     SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (!accept_passing(errno))
				accept_failed(w, errno);
			return;
		}
		take_conn(w, fd, (struct sockaddr *)&ss, sslen);
	}
}

static void accept_retry_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;

	if (!w->draining && !w->listener_paused)
		listeners_enable(w, true);
}

static void drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct conn *c, *next;

	log_warn("worker %d: drain timeout, closing %d connection(s)", w->id,
		 w->nconns);
	for (c = TAILQ_FIRST(&w->loop.conns); c != NULL; c = next) {
		next = conn_next(c);
		conn_abort(c);
	}
	idem_abort_orphans(&w->loop.idem);
	conn_loop_reap_later(&w->loop);
}

/* SIGTERM: stop accepting, close idle connections, let the others finish
 * within drain_timeout. */
static void start_drain(struct worker *w)
{
	struct timeval tv = clock_tv(w->loop.cfg->drain_timeout_ms);
	struct conn *c, *next;

	if (w->draining)
		return;
	w->draining = true;
	listeners_free(w);
	evtimer_del(w->accept_retry);
	for (c = TAILQ_FIRST(&w->loop.conns); c != NULL; c = next) {
		next = conn_next(c);
		conn_drain(c);
	}
	pp_accept_close_all(&w->loop);	/* not connections yet */
	upstream_pool_close_idle(w->loop.pool);
	evtimer_add(w->drain_timer, &tv);
	conn_loop_reap_later(&w->loop);
}

static void notify_cb(evutil_socket_t fd, short what, void *arg)
{
	struct worker *w = arg;
	struct config *cfg;
	eventfd_t n;

	/* reset the counter first: a post after it makes fd readable again */
	if (eventfd_read(fd, &n) < 0 && errno != EAGAIN)
		log_error("worker %d: reading its notice: %s", w->id,
			  strerror(errno));
	cfg = atomic_exchange(&w->next_cfg, NULL);

	if (cfg != NULL) {
		config_unref(w->loop.cfg);
		w->loop.cfg = cfg;
	}
	if (atomic_load(&w->stop))
		start_drain(w);
}

/* An engine finished after its client left: maybe the drain is over. */
static void orphans_changed(void *arg)
{
	struct worker *w = arg;

	if (w->draining)
		conn_loop_reap_later(&w->loop);
}

/*
 * The loop's base: without a lock (see the top), and with epoll's change
 * list: an event added and deleted in the same loop turn costs no
 * epoll_ctl (libevent's OpenSSL bufferevent arms and disarms its write
 * event around every response it writes). The change list's one caveat,
 * descriptors shared through dup(), does not apply here.
 */
static struct event_base *new_base(void)
{
	struct event_config *ec = event_config_new();
	struct event_base *base;

	if (ec == NULL)
		return NULL;
	event_config_set_flag(ec, EVENT_BASE_FLAG_NOLOCK);
	event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
	base = event_base_new_with_config(ec);
	event_config_free(ec);
	return base;
}

int worker_init(struct worker *w, int id, struct config *cfg,
		const evutil_socket_t *fds, int nfds,
		const struct upstream_target *t,
		struct store *store, struct tls_listener *tls)
{
	memset(w, 0, sizeof(*w));
	w->id = id;
	w->loop.tls = tls;
	w->nlisten = nfds;
	for (int i = 0; i < nfds; i++)
		w->listen_fds[i] = fds[i];
	w->loop.cfg = config_ref(cfg);
	TAILQ_INIT(&w->loop.conns);
	TAILQ_INIT(&w->loop.reap);
	TAILQ_INIT(&w->loop.pp_waits);
	atomic_init(&w->next_cfg, NULL);
	atomic_init(&w->stop, false);
	atomic_init(&w->exited, false);
	w->notify_fd = -1;
	w->loop.base = new_base();
	if (w->loop.base == NULL)
		goto fail;
	w->loop.pool = upstream_pool_new(w->loop.base, t);
	w->loop.store = store;
	if (idem_env_init(&w->loop.idem, w->loop.base, w->loop.pool, store) < 0)
		goto fail;
	w->loop.idem.orphans_changed = orphans_changed;
	w->loop.idem.orphans_arg = w;
	if (store_thread_init(store, w->loop.base) < 0)
		goto fail;
	w->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->notify_fd < 0)
		goto fail;
	w->notify = event_new(w->loop.base, w->notify_fd, EV_READ | EV_PERSIST,
			      notify_cb, w);
	w->loop.reap_ev = event_new(w->loop.base, -1, 0, reap_cb, w);
	w->drain_timer = evtimer_new(w->loop.base, drain_timeout_cb, w);
	w->accept_retry = evtimer_new(w->loop.base, accept_retry_cb, w);
	if (w->loop.pool == NULL || w->notify == NULL || w->loop.reap_ev == NULL ||
	    w->drain_timer == NULL || w->accept_retry == NULL ||
	    event_add(w->notify, NULL) < 0)
		goto fail;
	for (int i = 0; i < nfds; i++) {
		w->listeners[i] = event_new(w->loop.base, fds[i],
					    EV_READ | EV_PERSIST, accept_cb, w);
		if (w->listeners[i] == NULL || event_add(w->listeners[i], NULL) < 0)
			goto fail;
	}
	return 0;
fail:
	listeners_free(w);
	log_error("worker %d: cannot set up its event loop", id);
	return -1;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;

	event_base_dispatch(w->loop.base);
	atomic_store(&w->exited, event_base_got_exit(w->loop.base) ||
				 event_base_got_break(w->loop.base));
	if (w->done_fn != NULL)
		w->done_fn(w, w->done_arg);
	return NULL;
}

void worker_on_done(struct worker *w, worker_done_fn fn, void *arg)
{
	w->done_fn = fn;
	w->done_arg = arg;
}

int worker_start(struct worker *w)
{
	if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
		log_error("worker %d: cannot start its thread", w->id);
		return -1;
	}
	return 0;
}

/* Any thread: make the worker run notify_cb. */
static void post_notice(struct worker *w)
{
	/* fails only with the counter at its maximum: still readable */
	if (eventfd_write(w->notify_fd, 1) < 0 && errno != EAGAIN)
		log_error("worker %d: cannot be notified: %s", w->id,
			  strerror(errno));
}

void worker_post_config(struct worker *w, struct config *cfg)
{
	struct config *old = atomic_exchange(&w->next_cfg, config_ref(cfg));

	if (old != NULL)
		config_unref(old);
	post_notice(w);
}

void worker_post_stop(struct worker *w)
{
	atomic_store(&w->stop, true);
	post_notice(w);
}

bool worker_exited(struct worker *w)
{
	return atomic_load(&w->exited);
}

void worker_join(struct worker *w)
{
	pthread_join(w->thread, NULL);
}

void worker_free(struct worker *w)
{
	struct config *pending = atomic_exchange(&w->next_cfg, NULL);
	struct conn *c;

	/* connections still open when the loop ended (drain timeout) */
	while ((c = TAILQ_FIRST(&w->loop.conns)) != NULL)
		conn_abort(c);
	while ((c = TAILQ_FIRST(&w->loop.reap)) != NULL)
		conn_free(c);
	pp_accept_close_all(&w->loop);
	idem_env_free(&w->loop.idem);
	listeners_free(w);
	upstream_pool_free(w->loop.pool);
	if (w->loop.store != NULL && w->loop.base != NULL)
		store_thread_done(w->loop.store, w->loop.base);
	if (w->notify != NULL)
		event_free(w->notify);
	if (w->notify_fd >= 0)
		close(w->notify_fd);
	if (w->loop.reap_ev != NULL)
		event_free(w->loop.reap_ev);
	if (w->drain_timer != NULL)
		event_free(w->drain_timer);
	if (w->accept_retry != NULL)
		event_free(w->accept_retry);
	if (w->loop.base != NULL)
		event_base_free(w->loop.base);
	if (pending != NULL)
		config_unref(pending);
	if (w->loop.cfg != NULL)
		config_unref(w->loop.cfg);
}
