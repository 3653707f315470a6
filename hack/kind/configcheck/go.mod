// Checks hack/kind/config.yaml with kind's own loader and validation, which kind keeps in internal
// packages. Go's internal rule is by import path, so this module lives under kind's pkg/ path to
// import them; nothing of kind is copied. hack/kind/build-configcheck.sh builds it.
module sigs.k8s.io/kind/pkg/tesseraconfigcheck

go 1.24

require sigs.k8s.io/kind v0.33.0

require (
	github.com/BurntSushi/toml v1.4.0 // indirect
	github.com/evanphx/json-patch/v5 v5.6.0 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	sigs.k8s.io/yaml v1.4.0 // indirect
)
