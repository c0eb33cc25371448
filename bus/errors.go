package bus

import (
	"errors"
	"fmt"
	"time"
)

// Class is the failure class of a handler error. It decides whether a
// failure spends an attempt and whether the message is retried at all.
type Class int

const (
	// ClassCounted is the class of any error not marked otherwise: it spends one
	// attempt and is retried after backoff until the budget runs out.
	ClassCounted Class = iota
	// ClassTransient failures (timeouts, connection errors, an open circuit
	// breaker) spend no attempt; the message is probed again after the
	// transient delay.
	ClassTransient
	// ClassPermanent failures (undecodable payload, no handler) are not retried:
	// the message fails, or is dead-lettered, at once.
	ClassPermanent
)

// String returns "counted", "transient" or "permanent".
func (c Class) String() string {
	switch c {
	case ClassCounted:
		return "counted"
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	default:
		return fmt.Sprintf("Class(%d)", int(c))
	}
}

// ClassifiedError is an error marked with a failure class, and optionally
// with the time at which the message should be tried again.
type ClassifiedError struct {
	Class Class
	// At is the requested retry time; zero means "use backoff".
	At  time.Time
	Err error
}

func (e *ClassifiedError) Error() string {
	if e.Err == nil {
		return e.Class.String() + " failure"
	}
	return e.Err.Error()
}

func (e *ClassifiedError) Unwrap() error { return e.Err }

// Transient marks err as transient: retrying costs no attempt. A nil err
// stays nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &ClassifiedError{Class: ClassTransient, Err: err}
}

// Permanent marks err as permanent: the message is not retried. A nil
// err stays nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &ClassifiedError{Class: ClassPermanent, Err: err}
}

// RetryAt asks for the message to be tried again at t. The failure keeps the
// class err already has (counted when unmarked); an explicit time always wins
// over backoff. A nil err stays nil.
func RetryAt(t time.Time, err error) error {
	if err == nil {
		return nil
	}
	return &ClassifiedError{Class: ClassOf(err), At: t, Err: err}
}

// ClassOf returns the failure class of err: the class of the outermost
// ClassifiedError in its chain, ClassCounted for any other non-nil error.
func ClassOf(err error) Class {
	var ce *ClassifiedError
	if errors.As(err, &ce) {
		return ce.Class
	}
	return ClassCounted
}

// RetryTime returns the retry time requested with RetryAt, if any.
func RetryTime(err error) (time.Time, bool) {
	var ce *ClassifiedError
	for e := err; errors.As(e, &ce); e = ce.Err {
		if !ce.At.IsZero() {
			return ce.At, true
		}
	}
	return time.Time{}, false
}
