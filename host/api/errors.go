package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/kds-host/kds-host/host/resource"
)

// Error is the body of every error answer, in the shape of Kuma's API errors. Details is
// "<field>: <reason>" when one field is at fault, and Causes then names that field.
type Error struct {
	// Status is the HTTP status code; it is not part of the body, a Client fills it in.
	Status  int     `json:"-"`
	Title   string  `json:"title"`
	Details string  `json:"details"`
	Causes  []Cause `json:"causes,omitempty"`
}

// Cause is one field at fault.
type Cause struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	switch {
	case e.Details == "":
		return e.Title
	case e.Title == "":
		return e.Details
	}
	return e.Title + ": " + e.Details
}

// Titles of the errors the API answers with.
const (
	titleInvalid     = "Resource is not valid"
	titleNotFound    = "Not found"
	titleConflict    = "Conflict"
	titleReadOnly    = "Method not allowed"
	titleTooLarge    = "Request body too large"
	titleInternal    = "Internal server error"
	titleUnavailable = "Store unavailable"
	titleUnreadable  = "Stored resource unreadable"
	titleNoSpace     = "Store out of space"

	titleBatchTooLarge = "Batch too large"
)

// fieldError is an Error with status 400 that names one field.
func fieldError(field, format string, args ...any) *Error {
	reason := fmt.Sprintf(format, args...)
	return &Error{
		Status:  http.StatusBadRequest,
		Title:   titleInvalid,
		Details: field + ": " + reason,
		Causes:  []Cause{{Field: field, Message: reason}},
	}
}

// fromValidation turns a *resource.ValidationError into a 400 naming its field.
func fromValidation(err error) *Error {
	var ve *resource.ValidationError
	if errors.As(err, &ve) {
		return fieldError(ve.Field, "%s", ve.Reason)
	}
	return &Error{Status: http.StatusBadRequest, Title: titleInvalid, Details: err.Error()}
}

// resourceFields lists the top-level fields of a resource document, for unknown-field errors.
const resourceFields = "type, mesh, name, labels, owners, spec, generation"

// fromDecode turns a JSON decoding error of a resource document into a 400 naming the field.
func fromDecode(err error) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return fieldError("body", "must be an object, not a JSON %s", te.Value)
		}
		return fieldError(te.Field, "must be %s, not a JSON %s", describeType(te.Type), te.Value)
	}
	const unknown = "json: unknown field "
	if msg := err.Error(); strings.HasPrefix(msg, unknown) {
		field := strings.TrimPrefix(msg, unknown)
		if f, uerr := strconv.Unquote(field); uerr == nil {
			field = f
		}
		return fieldError(field, "unknown field (a resource has %s)", resourceFields)
	}
	return fieldError("body", "%v", err)
}

func describeType(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map:
		if t.Elem().Kind() == reflect.String {
			return "an object of strings"
		}
		return "an object"
	case reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return "a " + t.String()
}

// WriteJSON answers v as indented JSON with status: the one JSON writer of every kds-host route,
// the API's own and those mounted beside it.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		b, status = []byte(`{"title":"Internal server error","details":"cannot encode the response"}`), http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if _, werr := w.Write(append(b, '\n')); werr != nil && err == nil {
		err = werr
	}
	return err
}

// WriteError answers e, with e.Status, in the API's error shape.
func WriteError(w http.ResponseWriter, e *Error) error { return WriteJSON(w, e.Status, e) }
