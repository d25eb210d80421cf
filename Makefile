# The build interface PGXN's client expects (`pgxn install` runs `make`, then `make install`),
# over cargo-pgrx. For one PostgreSQL major, the one PG_CONFIG names:
#   make PG_CONFIG=/usr/lib/postgresql/17/bin/pg_config
#   sudo make install PG_CONFIG=/usr/lib/postgresql/17/bin/pg_config    [DESTDIR=/staging]
# Needs Rust 1.95 or later, cargo-pgrx 0.18.1 (cargo install cargo-pgrx --version 0.18.1
# --locked), clang, libclang-dev, pkg-config, libssl-dev, protobuf-compiler (the etcd
# client's build runs protoc), libprotobuf-dev and that major's server headers
# (postgresql-server-dev-17). See docs/install.md.
# The library must then be added to shared_preload_libraries (a restart).

PG_CONFIG ?= pg_config
CARGO ?= cargo
PG_MAJOR := $(shell $(PG_CONFIG) --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
PACKAGE := $(TARGET_DIR)/release/snowflake-pg$(PG_MAJOR)
# Absolute: the install recipes run inside $(PACKAGE).
DEST := $(if $(DESTDIR),$(abspath $(DESTDIR)))
EXTENSION_DIR := $(shell $(PG_CONFIG) --sharedir)/extension
# pgrx reads the server's headers through this pg_config: no `cargo pgrx init` needed.
export PGRX_PG_CONFIG_PATH := $(PG_CONFIG)

.PHONY: all install uninstall clean

# cargo pgrx package lays the files out at pg_config's paths under $(PACKAGE); the install
# scripts of earlier releases (kept frozen in sql/) are added beside the generated one, and
# the secondary control files (sql/snowflake--<version>.control: earlier versions are for
# superusers only, see docs/upgrades.md), which cargo pgrx does not copy.
all:
	rm -rf $(PACKAGE)
	$(CARGO) pgrx package --pg-config $(PG_CONFIG) --no-default-features --features pg$(PG_MAJOR)
	for f in sql/snowflake--*.sql; do \
		case "$$f" in *--*--*) ;; *) install -m 644 "$$f" $(PACKAGE)$(EXTENSION_DIR)/ ;; esac; \
	done
	install -m 644 sql/snowflake--*.control $(PACKAGE)$(EXTENSION_DIR)/

install:
	test -d $(PACKAGE) || { echo "run make first" >&2; exit 1; }
	cd $(PACKAGE) && find . -type f -exec install -D -m 644 {} $(DEST)/{} \;

uninstall:
	cd $(PACKAGE) && find . -type f -exec rm -f $(DEST)/{} \;

clean:
	rm -rf $(TARGET_DIR)/release/snowflake-pg*
