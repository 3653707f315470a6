// Command configcheck loads a kind cluster config the way `kind create cluster --config` does
// (strict decoding, defaults, conversion to kind's internal types), runs kind's validation, applies
// the containerd patches to an empty containerd config of each version kind supports, and prints
// what it found as JSON for tests/unit/test_kind.py.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"sigs.k8s.io/kind/pkg/apis/config/defaults"
	"sigs.k8s.io/kind/pkg/internal/apis/config/encoding"
	"sigs.k8s.io/kind/pkg/internal/patch"
)

type node struct {
	Role   string            `json:"role"`
	Image  string            `json:"image"`
	Labels map[string]string `json:"labels"`
}

type report struct {
	Name             string            `json:"name"`
	KindDefaultImage string            `json:"kindDefaultImage"`
	FeatureGates     map[string]bool   `json:"featureGates"`
	RuntimeConfig    map[string]string `json:"runtimeConfig"`
	Nodes            []node            `json:"nodes"`
	// containerd config version -> an empty config of that version after kind's patching (TOML)
	Containerd map[string]string `json:"containerd"`
}

func run(path string) error {
	cfg, err := encoding.Load(path)
	if err != nil {
		return fmt.Errorf("loading %s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("kind rejects %s: %w", path, err)
	}
	out := report{
		Name:             cfg.Name,
		KindDefaultImage: defaults.Image,
		FeatureGates:     cfg.FeatureGates,
		RuntimeConfig:    cfg.RuntimeConfig,
		Containerd:       map[string]string{},
	}
	for _, n := range cfg.Nodes {
		out.Nodes = append(out.Nodes, node{Role: string(n.Role), Image: n.Image, Labels: n.Labels})
	}
	for _, version := range []int{2, 3} {
		patched, err := patch.ContainerdTOML(
			fmt.Sprintf("version = %d\n", version), cfg.ContainerdConfigPatches, cfg.ContainerdConfigPatchesJSON6902)
		if err != nil {
			return fmt.Errorf("containerd config version %d: %w", version, err)
		}
		out.Containerd[fmt.Sprint(version)] = patched
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	return encoder.Encode(out)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: configcheck <kind cluster config>")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
