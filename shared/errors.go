package shared

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// InvalidArgument is the error a plugin returns for bad input: field names what is wrong, so the
// person reading the host's log can act on it.
func InvalidArgument(field, format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...))
}

// toStatus turns an error returned by an implementation into a gRPC status error: status errors
// keep their code, context errors become DeadlineExceeded or Canceled, anything else Internal.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// fromStatus turns an error from a gRPC call back into a Go error. The status survives (so
// status.Code works on it), and a deadline or a cancellation also matches the context errors with
// errors.Is, so callers can tell "the plugin was slow" from "the plugin said no".
func fromStatus(op string, err error) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.DeadlineExceeded:
		return &callError{op: op, st: st, ctxErr: context.DeadlineExceeded}
	case codes.Canceled:
		return &callError{op: op, st: st, ctxErr: context.Canceled}
	}
	return &callError{op: op, st: st}
}

// callError is a failed plugin call: its gRPC status, and the context error it stands for.
type callError struct {
	op     string
	st     *status.Status
	ctxErr error
}

func (e *callError) Error() string {
	return fmt.Sprintf("plugin %s: %s: %s", e.op, e.st.Code(), e.st.Message())
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *callError) GRPCStatus() *status.Status { return e.st }

func (e *callError) Unwrap() error { return e.ctxErr }
