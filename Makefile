# AuthBroker: `make run` builds and runs the daemon in the foreground; `make test` runs every test.
SHELL := /bin/sh
export PATH := /opt/swift/usr/bin:$(PATH)
# Our targets build with warnings as errors (see Package.swift).
export AUTHBROKER_WARNINGS_AS_ERRORS := 1
SWIFT ?= swift
PREFIX ?= $(HOME)/.local
UNIT_DIR ?= $(HOME)/.config/systemd/user

.PHONY: run test fuzz bench soak build release install uninstall verify-units clean

## Installs what is missing, builds, and runs authbrokerd in the foreground (Ctrl-C stops it).
run:
	scripts/install-deps run
	$(SWIFT) build -c release --product authbrokerd
	$(SWIFT) build -c release --product authbrokerctl
	exec .build/release/authbrokerd

## Installs what is missing, builds, and runs all tests (unit and integration).
## Serial: the integration tests' socket client blocks its thread, and parallel tests would
## starve Swift's cooperative pool (two threads on a two-core machine).
## Then once more under the thread sanitizer, from a build of its own (.build-tsan): every suite
## but the integration tests, which drive the daemon as a separate process (the client library's
## suites start the sanitized daemon too). A race report fails the run (TSan's exit code).
## Each test run is bounded (TEST_TIMEOUT seconds; `timeout` kills its whole process group): a
## test process that dies while something it started still holds SwiftPM's output pipe would
## otherwise leave `swift test` waiting for ever. Both runs take minutes on 2 cores.
## scripts/test-log repeats a failed run's failure lines at its end, where a CI log's tail shows them.
TEST_TIMEOUT ?= 1800
test:
	scripts/install-deps test
	$(SWIFT) build --build-tests
	scripts/test-log timeout --kill-after=30 $(TEST_TIMEOUT) scripts/with-test-keyring \
		$(SWIFT) test --skip-build --no-parallel
	$(SWIFT) build --build-tests --sanitize=thread --scratch-path .build-tsan
	scripts/test-log timeout --kill-after=30 $(TEST_TIMEOUT) scripts/with-test-keyring \
		$(SWIFT) test --skip-build --sanitize=thread --scratch-path .build-tsan --no-parallel \
		--skip AuthBrokerIntegrationTests
	scripts/fuzz $(FUZZ_CI_SECONDS)

## Every libFuzzer target for FUZZ_SECONDS each (default 300); `test` runs them for 20 s.
## CI cost of `scripts/fuzz 20` in `test`: the release fuzz build from nothing took 662 s of CPU
## (29.5 min wall on the shared, loaded 2-core machine; ~6-8 min on 2 idle cores, estimated from
## the CPU time), and the runs 138 s wall with the build done. Debug/release figures: scripts/fuzz.
FUZZ_SECONDS ?= 300
FUZZ_CI_SECONDS ?= 20
fuzz:
	scripts/fuzz $(FUZZ_SECONDS)

## Benchmarks against nginx directly and Squid on loopback (minutes; never part of `test`).
## Installs nginx and squid-openssl if missing; writes bench-results/RESULTS.md.
bench:
	scripts/bench

## Soak: the release daemon under mixed traffic for SOAK_SECONDS (default 300); every response
## checked, memory and descriptors sampled; writes bench-results/SOAK.md. Never part of `test`.
soak:
	scripts/soak

build:
	$(SWIFT) build

release:
	$(SWIFT) build -c release

## Installs the binaries into $(PREFIX)/bin and the systemd user units, then enables the socket.
install: release
	install -d $(PREFIX)/bin $(UNIT_DIR) $(HOME)/.local/share/doc/authbroker
	install -m 0755 .build/release/authbrokerd .build/release/authbrokerctl $(PREFIX)/bin/
	install -m 0644 systemd/authbrokerd.socket systemd/authbrokerd.service systemd/authbroker-proxy.socket $(UNIT_DIR)/
	install -m 0644 README.md etc/authbroker/config.toml $(HOME)/.local/share/doc/authbroker/
	systemctl --user daemon-reload && systemctl --user enable --now authbrokerd.socket || \
		echo "make install: no user systemd manager here; run authbrokerd by hand"

uninstall:
	-systemctl --user disable --now authbroker-proxy.socket authbrokerd.socket authbrokerd.service
	rm -f $(PREFIX)/bin/authbrokerd $(PREFIX)/bin/authbrokerctl
	rm -f $(UNIT_DIR)/authbrokerd.socket $(UNIT_DIR)/authbrokerd.service $(UNIT_DIR)/authbroker-proxy.socket

verify-units:
	systemd-analyze verify systemd/authbrokerd.socket systemd/authbrokerd.service systemd/authbroker-proxy.socket

clean:
	rm -rf .build .build-fuzz .build-tsan
