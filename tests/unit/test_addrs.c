/*
 * test_addrs.c - the address list of a name: order kept, duplicates and
 * other families dropped, the cap, the numeric forms used in logs.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/un.h>

#include "addrs.h"
#include "tap.h"

static struct sockaddr_in v4(const char *ip, int port)
{
	struct sockaddr_in s = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port) };

	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

static struct sockaddr_in6 v6(const char *ip, int port)
{
	struct sockaddr_in6 s = { .sin6_family = AF_INET6,
				  .sin6_port = htons((uint16_t)port) };

	inet_pton(AF_INET6, ip, &s.sin6_addr);
	return s;
}

static void link_ai(struct addrinfo *ai, int n)
{
	for (int i = 0; i + 1 < n; i++)
		ai[i].ai_next = &ai[i + 1];
	ai[n - 1].ai_next = NULL;
}

static void order_and_duplicates(void)
{
	struct sockaddr_in6 loop6 = v6("::1", 8000);
	struct sockaddr_in loop4 = v4("127.0.0.1", 8000);
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	struct addrinfo ai[4] = {
		{ .ai_family = AF_INET6, .ai_addr = (struct sockaddr *)&loop6,
		  .ai_addrlen = sizeof(loop6) },
		{ .ai_family = AF_UNIX, .ai_addr = (struct sockaddr *)&un,
		  .ai_addrlen = sizeof(un) },
		{ .ai_family = AF_INET, .ai_addr = (struct sockaddr *)&loop4,
		  .ai_addrlen = sizeof(loop4) },
		{ .ai_family = AF_INET6, .ai_addr = (struct sockaddr *)&loop6,
		  .ai_addrlen = sizeof(loop6) },
	};
	struct addrs a;
	char buf[ADDRS_STRLEN];

	link_ai(ai, 4);
	is_int(addrs_from_addrinfo(&a, ai), 2, "::1 and 127.0.0.1 kept once each");
	is_str(addrs_str((struct sockaddr *)&a.ss[0], a.len[0], buf, sizeof(buf)),
	       "[::1]:8000", "the resolver's order: ::1 first");
	is_str(addrs_str((struct sockaddr *)&a.ss[1], a.len[1], buf, sizeof(buf)),
	       "127.0.0.1:8000", "then 127.0.0.1");
	is_str(addrs_host((struct sockaddr *)&a.ss[0], a.len[0], buf, sizeof(buf)),
	       "::1", "the host alone has no brackets");
}

static void the_cap(void)
{
	struct sockaddr_in s[ADDRS_MAX + 3];
	struct addrinfo ai[ADDRS_MAX + 3];
	struct addrs a;
	char ip[32], buf[ADDRS_STRLEN];

	memset(ai, 0, sizeof(ai));
	for (int i = 0; i < ADDRS_MAX + 3; i++) {
		snprintf(ip, sizeof(ip), "10.0.0.%d", i + 1);
		s[i] = v4(ip, 80);
		ai[i].ai_family = AF_INET;
		ai[i].ai_addr = (struct sockaddr *)&s[i];
		ai[i].ai_addrlen = sizeof(s[i]);
	}
	link_ai(ai, ADDRS_MAX + 3);
	is_int(addrs_from_addrinfo(&a, ai), ADDRS_MAX, "at most ADDRS_MAX kept");
	snprintf(ip, sizeof(ip), "10.0.0.%d:80", ADDRS_MAX);
	is_str(addrs_str((struct sockaddr *)&a.ss[ADDRS_MAX - 1],
			 a.len[ADDRS_MAX - 1], buf, sizeof(buf)), ip,
	       "the first ones, in order");
	is_int(addrs_from_addrinfo(&a, NULL), 0, "an empty answer is empty");
}

static void resolving(void)
{
	struct addrs a;
	char err[256], buf[ADDRS_STRLEN];

	ok(addrs_resolve(&a, "127.0.0.1", "9000", 0, "--upstream", err,
			 sizeof(err)) == 0 && a.n == 1, "an IPv4 literal");
	is_str(addrs_str((struct sockaddr *)&a.ss[0], a.len[0], buf, sizeof(buf)),
	       "127.0.0.1:9000", "with its port");
	ok(addrs_resolve(&a, "::1", "9000", 1, "--listen", err,
			 sizeof(err)) == 0 && a.n == 1, "an IPv6 literal");
	is_str(addrs_str((struct sockaddr *)&a.ss[0], a.len[0], buf, sizeof(buf)),
	       "[::1]:9000", "in brackets");
	ok(addrs_resolve(&a, "no-such-host.invalid", "9000", 0, "--upstream",
			 err, sizeof(err)) < 0 && a.n == 0, "a name that does not resolve");
	ok(strncmp(err, "--upstream: cannot resolve no-such-host.invalid:9000: ",
		   54) == 0, "the error names the option and the name: %s", err);
}

int main(void)
{
	order_and_duplicates();
	the_cap();
	resolving();
	return tap_done();
}
