package postgres

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// The metadata column a writer builds is what json.Marshal makes of the same
// map, byte for byte: the size limits count the same bytes either way.
func TestMetaPairs_WritesWhatJSONMarshalWrites(t *testing.T) {
	texts := []string{
		"", "a", "partition_key", "key-1", `quote " and \ backslash`, "<script>&amp;</script>",
		"tab\tnew\nline\rret\bback\fform", "\x00\x01\x1f\x7f", "é ü 日本", "\u2028\u2029",
		"bad \xff utf-8 \xc3", "emoji 🙂", "trailing \\",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 2000 {
		var o metaPairs
		want := map[string]string{}
		for range rng.IntN(9) {
			k := texts[rng.IntN(len(texts))] + texts[rng.IntN(len(texts))]
			v := texts[rng.IntN(len(texts))]
			o = o.set(k, v)
			want[k] = v
		}
		if round%3 == 0 && len(o) > 0 {
			k := o[0].k
			o = o.remove(k)
			delete(want, k)
		}
		wantJSON, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		if got := o.json(); string(got) != string(wantJSON) {
			t.Fatalf("round %d: metaPairs wrote\n%s\njson.Marshal writes\n%s", round, got, wantJSON)
		}
	}
}

func TestMetaPairs_SetReplacesAndGetReads(t *testing.T) {
	var o metaPairs
	o = o.set("b", "1")
	o = o.set("a", "2")
	o = o.set("b", "3")
	if got := o.get("b"); got != "3" {
		t.Errorf("get(b) = %q after setting it again to 3", got)
	}
	if got := o.get("c"); got != "" {
		t.Errorf("get(c) = %q for a key never set, want empty", got)
	}
	if got, want := string(o.json()), `{"a":"2","b":"3"}`; got != want {
		t.Errorf("json() = %s, want %s", got, want)
	}
}
