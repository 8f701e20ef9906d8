// Package readme holds the tests that keep the README and the guides in
// docs/ true: every command of the README is run and its output compared
// (TestREADME); README.zh-CN.md, the README in Chinese, carries README.md's
// fenced blocks, images and links unchanged and in order; every Go block
// is an excerpt of the Example it names, which go test runs; the README's
// policy table and docs/policies.md name the whole policy language; and
// each module's go directive is the lowest its dependencies allow, which
// the README names. It has no code.
package readme
