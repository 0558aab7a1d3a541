# The README's first-screen commands on a fresh Debian 12 (debootstrap root, chroot; root only):
#   make fresh-check        make test && make demo in it (caches of packages and modules bound in)
#   make fresh-check-setup  its set-up half: install-deps, the Go toolchain, make build
.PHONY: fresh-check fresh-check-setup
fresh-check:
	./hack/fresh-check.sh
fresh-check-setup:
	./hack/fresh-check.sh --setup-only
