// Package readme holds the test that runs the commands of the README, so
// that what the README says stays what the binaries do, and the test that
// README.zh-CN.md, the README in Chinese, carries README.md's fenced blocks,
// images and links unchanged and in order. It has no code.
package readme
