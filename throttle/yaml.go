package throttle

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// ParsePolicyFile reads a YAML file of policies: a mapping from policy name
// (a tenant, "*" or "@global") to either the policy's text form or a
// mapping of the same fields:
//
//	"*": "rate=10/s concurrency=2"
//	"@global":
//	  rate: 1000/s
//	acme:
//	  rate: [100/s burst 20, 5000/h]   # or rate: 100/s with burst: 20
//	  window: 600/min
//	  quota: 10000/day
//	  tz: America/Los_Angeles
//	  concurrency: 5
//	  lease: 30s
//	  overflow: wait
//	  max_wait: 500ms
//	  backlog: 50000
//	  weight: 2
//
// Entries may share fields through YAML anchors and merge keys
// ("<<: *defaults"); fields given in the entry win. An empty entry ("acme:")
// is the policy with no rules. Every entry is validated; the error names the
// entry, its line and the field, and nothing is returned unless every entry
// is good.
func ParsePolicyFile(data []byte) (map[string]*Policy, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if err.Error() == "EOF" {
			return map[string]*Policy{}, nil
		}
		return nil, fmt.Errorf("policy file: not valid YAML: %v", err)
	}
	if len(root.Content) == 0 {
		return map[string]*Policy{}, nil
	}
	top := root.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("policy file line %d: want a mapping of policy name to policy, e.g. \"acme: {rate: 100/s}\"", top.Line)
	}
	out := map[string]*Policy{}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		name := k.Value
		if err := validatePolicyName(name); err != nil {
			return nil, fmt.Errorf("policy file line %d: %v", k.Line, err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("policy file line %d: %q is given twice", k.Line, name)
		}
		text, err := yamlPolicyText(v)
		if err != nil {
			return nil, fmt.Errorf("policy file line %d, %q: %v", v.Line, name, err)
		}
		p, err := ParsePolicy(text)
		if err == nil {
			err = adaptsGlobal(name, p)
		}
		if err != nil {
			return nil, fmt.Errorf("policy file line %d, %q: %v", fieldLine(v, err), name, err)
		}
		out[name] = p
	}
	return out, nil
}

// fieldLine is the line of the field of mapping entry v that err names,
// or the entry's own line.
func fieldLine(v *yaml.Node, err error) int {
	var pe *PolicyError
	if v.Kind == yaml.MappingNode && errors.As(err, &pe) && pe.Field != "" {
		for i := 0; i+1 < len(v.Content); i += 2 {
			if v.Content[i].Value == pe.Field {
				return v.Content[i].Line
			}
		}
	}
	return v.Line
}

// yamlFields are the keys a policy mapping may have, in text-form order:
// each rule kind's options, then the policy's own.
func yamlFields() []string { return knownOptions() }

// yamlPolicyText turns one entry into the policy's text form, so the text
// parser is the only place that reads rules.
func yamlPolicyText(v *yaml.Node) (string, error) {
	v = resolveAlias(v)
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return "", nil // "acme:" or "acme: ~" is the policy with no rules
		}
		return v.Value, nil
	case yaml.MappingNode:
	default:
		return "", fmt.Errorf("want the policy text or a mapping of fields (%s)", strings.Join(yamlFields(), ", "))
	}
	fields := map[string]*yaml.Node{}
	var merged []*yaml.Node
	for i := 0; i+1 < len(v.Content); i += 2 {
		key := v.Content[i].Value
		if key == "<<" {
			// a merge key (<<: *defaults): its fields apply unless given here
			m := resolveAlias(v.Content[i+1])
			items := []*yaml.Node{m}
			if m.Kind == yaml.SequenceNode {
				items = m.Content
			}
			for _, item := range items {
				if item = resolveAlias(item); item.Kind != yaml.MappingNode {
					return "", fmt.Errorf("line %d: << merges a mapping of fields or a list of them", item.Line)
				}
				merged = append(merged, item)
			}
			continue
		}
		if err := knownField(key, v.Content[i].Line); err != nil {
			return "", err
		}
		if _, dup := fields[key]; dup {
			return "", fmt.Errorf("line %d: field %q is given twice", v.Content[i].Line, key)
		}
		fields[key] = v.Content[i+1]
	}
	explicit := map[string]bool{}
	for key := range fields {
		explicit[key] = true
	}
	for _, m := range merged {
		for i := 0; i+1 < len(m.Content); i += 2 {
			key := m.Content[i].Value
			if err := knownField(key, m.Content[i].Line); err != nil {
				return "", err
			}
			if _, ok := fields[key]; !ok {
				fields[key] = m.Content[i+1]
			}
		}
	}
	for key, n := range fields {
		fields[key] = resolveAlias(n)
	}
	var parts []string
	for _, k := range kinds {
		if k == nil {
			continue
		}
		opts, err := k.yaml(fields, explicit)
		if err != nil {
			return "", err
		}
		parts = append(parts, opts...)
	}
	opts, err := yamlOptions(fields, policyOptions)
	if err != nil {
		return "", err
	}
	return strings.Join(append(parts, opts...), " "), nil
}

// yamlScalar is field key of a YAML entry as one value.
func yamlScalar(fields map[string]*yaml.Node, key string) (string, error) {
	n := fields[key]
	if n.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("line %d: %s must be a single value", n.Line, key)
	}
	if n.Value == "" {
		return "", fmt.Errorf("line %d: %s is empty", n.Line, key)
	}
	return n.Value, nil
}

// yamlOptions turns the given keys of a YAML entry, each a single value,
// into text-form options.
func yamlOptions(fields map[string]*yaml.Node, keys []string) ([]string, error) {
	var parts []string
	for _, key := range keys {
		if _, ok := fields[key]; !ok {
			continue
		}
		val, err := yamlScalar(fields, key)
		if err != nil {
			return nil, err
		}
		if strings.ContainsAny(val, " \t\"") {
			val = `"` + strings.ReplaceAll(val, `"`, "") + `"`
		}
		parts = append(parts, key+"="+val)
	}
	return parts, nil
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func knownField(key string, line int) error {
	if slices.Contains(yamlFields(), key) {
		return nil
	}
	return fmt.Errorf("line %d: unknown field %q; known: %s", line, key, strings.Join(yamlFields(), ", "))
}
