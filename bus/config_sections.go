package bus

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Section returns a copy of the configuration section of the transport
// registered under key (Transport.Key): a pointer to the transport's section
// struct, a new zero one when c has none, or nil when no transport linked
// into the program registered key. Changing the copy does not change c;
// SetSection does. Transports wrap it in a typed accessor
// (kafka.Section(cfg)).
func (c Config) Section(key string) any {
	t, ok := sectionOf(key)
	if !ok {
		return nil
	}
	if s, ok := c.sections[key]; ok {
		return cloneSection(s)
	}
	return t.NewSection()
}

// SetSection sets c's section key to a copy of *section, a pointer to the
// section struct of the transport registered under key. It panics when no
// transport registered key or section is of another type. Copies of c made
// before keep their section.
func (c *Config) SetSection(key string, section any) {
	t, ok := sectionOf(key)
	if !ok {
		panic("bus: SetSection: no transport registered section " + key)
	}
	if reflect.TypeOf(section) != reflect.TypeOf(t.NewSection()) {
		panic(fmt.Sprintf("bus: SetSection %s: %T is not %T", key, section, t.NewSection()))
	}
	// A new map each time: copies of c never share a change.
	m := make(map[string]any, len(c.sections)+1)
	for k, v := range c.sections {
		m[k] = v
	}
	m[key] = cloneSection(section)
	c.sections = m
}

// cloneSection returns a pointer to a copy of the struct p points to, its
// string lists copied too.
func cloneSection(p any) any {
	v := reflect.New(reflect.TypeOf(p).Elem())
	v.Elem().Set(reflect.ValueOf(p).Elem())
	cloneLists(v.Elem())
	return v.Interface()
}

// cloneLists replaces every string list under the struct v by a copy.
func cloneLists(v reflect.Value) {
	walkConfig(v, "", func(_ string, _ reflect.StructField, f reflect.Value) {
		if f.Kind() == reflect.Slice && !f.IsNil() {
			f.Set(reflect.AppendSlice(reflect.MakeSlice(f.Type(), 0, f.Len()), f))
		}
	})
}

// docLayout is the shape of a whole configuration document: Config's keys
// with the sections of the registered transports after postgres, sorted by
// key. The loader, the environment, printing and ConfigKeys all walk it, so
// a registered section is loaded, listed and redacted like Config's own keys.
type docLayout struct {
	typ      reflect.Type
	config   []int             // doc field i holds Config field config[i], or -1
	sections map[int]Transport // doc field i holds this transport's section
}

var docTypeCache atomic.Pointer[docLayout]

func layout() *docLayout {
	if l := docTypeCache.Load(); l != nil {
		return l
	}
	l := &docLayout{sections: map[int]Transport{}}
	var fields []reflect.StructField
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		f := ct.Field(i)
		if !f.IsExported() {
			continue
		}
		fields = append(fields, reflect.StructField{Name: f.Name, Type: f.Type, Tag: f.Tag})
		l.config = append(l.config, i)
		if f.Name == "Postgres" {
			for n, t := range registeredSections() {
				l.sections[len(fields)] = t
				fields = append(fields, reflect.StructField{
					Name: fmt.Sprintf("Section%d", n),
					Type: reflect.TypeOf(t.NewSection()).Elem(),
					Tag:  reflect.StructTag(fmt.Sprintf(`yaml:%q`, t.Key)),
				})
				l.config = append(l.config, -1)
			}
		}
	}
	l.typ = reflect.StructOf(fields)
	docTypeCache.Store(l)
	return l
}

// doc returns c as an addressable document value (see docLayout); its
// string lists are copies.
func (c Config) doc() reflect.Value {
	l := layout()
	d := reflect.New(l.typ).Elem()
	cv := reflect.ValueOf(c)
	for i, ci := range l.config {
		switch {
		case ci >= 0:
			d.Field(i).Set(cv.Field(ci))
		default:
			if s, ok := c.sections[l.sections[i].Key]; ok {
				d.Field(i).Set(reflect.ValueOf(s).Elem())
			}
		}
	}
	cloneLists(d)
	return d
}

// fromDoc returns c with the keys of the document d (from c.doc or the
// loader).
func (c Config) fromDoc(d reflect.Value) Config {
	l := layout()
	cv := reflect.ValueOf(&c).Elem()
	m := make(map[string]any, len(l.sections))
	for i, ci := range l.config {
		if ci >= 0 {
			cv.Field(ci).Set(d.Field(i))
			continue
		}
		s := reflect.New(d.Field(i).Type())
		s.Elem().Set(d.Field(i))
		m[l.sections[i].Key] = s.Interface()
	}
	c.sections = m
	return c
}

// withSectionDefaults returns c with every registered section present and
// its defaults applied.
func (c Config) withSectionDefaults() Config {
	m := make(map[string]any, len(c.sections))
	for _, t := range registeredSections() {
		s := c.Section(t.Key)
		if t.Defaults != nil {
			t.Defaults(s)
		}
		m[t.Key] = s
	}
	c.sections = m
	return c
}

// topLevelKeys returns Config's own top-level keys.
func topLevelKeys() map[string]bool {
	out := map[string]bool{}
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		if name := yamlName(ct.Field(i)); name != "" {
			out[name] = true
		}
	}
	return out
}

// yamlName is the key of a struct field ("" for none), and whether the
// field's keys are inlined into its parent's.
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}

func isInline(f reflect.StructField) bool {
	_, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return f.Anonymous && slices.Contains(strings.Split(opts, ","), "inline") && f.Type.Kind() == reflect.Struct
}

func isNested(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Duration]()
}

// walkConfig calls fn for every leaf key of the struct v, depth first in
// declaration order, with its dotted YAML path. Inlined structs
// (`yaml:",inline"`) add their keys to their parent's.
func walkConfig(v reflect.Value, prefix string, fn func(key string, f reflect.StructField, v reflect.Value)) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if isInline(f) {
			walkConfig(v.Field(i), prefix, fn)
			continue
		}
		name := yamlName(f)
		if name == "" {
			continue
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		if isNested(f.Type) {
			walkConfig(v.Field(i), key, fn)
			continue
		}
		fn(key, f, v.Field(i))
	}
}

// yamlFields maps the keys of struct t (inlined ones included) to their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if isInline(f) {
			for k, ft := range yamlFields(f.Type) {
				fields[k] = ft
			}
		} else if name := yamlName(f); name != "" {
			fields[name] = f.Type
		}
	}
	return fields
}

// checkSectionType reports a field of a section struct that the loader
// cannot set from the environment.
func checkSectionType(t reflect.Type) error {
	var err error
	walkConfig(reflect.New(t).Elem(), "", func(key string, f reflect.StructField, v reflect.Value) {
		if err == nil && setFromString(reflect.New(f.Type).Elem(), "") != nil {
			err = fmt.Errorf("section key %s has type %s, which the loader does not support", key, f.Type)
		}
	})
	return err
}
