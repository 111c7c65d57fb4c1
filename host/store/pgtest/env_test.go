package pgtest_test

import "os"

func testingEnv(k string) string { return os.Getenv(k) }
