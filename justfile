# Reproduce the FLASH and GQA papers. `just` lists the recipes.

experiments := "table11"

default:
    @just --list

# Run one experiment: `just repro table11 --profile cpu` (profiles: smoke, cpu, paper; more options: --device, --config, --set key=value, --out, --report)
repro id *args:
    @if ! echo " {{experiments}} " | grep -q " {{id}} "; then echo "error: unknown experiment \`{{id}}\`; known: {{experiments}}" >&2; exit 2; fi
    cargo run --release --quiet -p experiments --bin {{id}} -- {{args}}

# Re-render an experiment's charts and tables from its existing CSVs
report id *args:
    just repro {{id}} --report {{args}}

# Every experiment at smoke scale (seconds each)
smoke:
    for id in {{experiments}}; do just repro $id --profile smoke || exit 1; done

# All tests of the workspace
test:
    cargo test --workspace

# Formatting and lints, as CI checks them
lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings
