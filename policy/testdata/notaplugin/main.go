// Command notaplugin is a test fixture: an ordinary program, not a plugin. It greets on stdout
// and then runs until it is killed, as a server would.
package main

import (
	"fmt"
	"time"
)

func main() {
	fmt.Println("notaplugin: hello, I am an ordinary program")
	time.Sleep(time.Hour)
}
