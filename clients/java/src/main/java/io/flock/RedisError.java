package io.flock;

/** An error reply from the server; {@link #code()} is its first word ({@code NOTOWNER}, {@code ERR}, ...). */
public class RedisError extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /**
     * An error reply.
     *
     * @param message the reply's text, its code first
     */
    public RedisError(String message) {
        super(message);
    }

    /**
     * The error code.
     *
     * @return the first word of the message
     */
    public String code() {
        return codeOf(getMessage());
    }

    /**
     * The error as the exception its code has in this client ({@link UpgradeException}, {@link WrongModeException},
     * {@link DeadlockException}),
     * the original as its cause; any other error as it is.
     */
    static RuntimeException specific(RuntimeException error) {
        switch (codeOf(error)) {
            case "UPGRADE":
                return new UpgradeException(error);
            case "WRONGMODE":
                return new WrongModeException(error);
            case "DEADLOCK":
                return new DeadlockException(error);
            default:
                return error;
        }
    }

    RedisError(Throwable cause) {
        super(messageOf(cause), cause);
    }

    private static String messageOf(Throwable error) {
        for (Throwable t = error; t != null; t = t.getCause()) {
            if (!codeOf(t.getMessage()).isEmpty()) {
                return t.getMessage();
            }
        }
        return String.valueOf(error);
    }

    /**
     * The error code of any client library's error: the first upper-case word of the message of the exception or
     * one of its causes (Spring wraps the driver's exception), or "" when none has one.
     *
     * @param error any exception
     * @return its code, or ""
     */
    public static String codeOf(Throwable error) {
        for (Throwable t = error; t != null; t = t.getCause()) {
            String code = codeOf(t.getMessage());
            if (!code.isEmpty()) {
                return code;
            }
            if (t.getCause() == t) {
                break;
            }
        }
        return "";
    }

    private static String codeOf(String message) {
        if (message == null) {
            return "";
        }
        int end = message.indexOf(' ');
        String word = end < 0 ? message : message.substring(0, end);
        return !word.isEmpty() && word.chars().allMatch(c -> c >= 'A' && c <= 'Z') ? word : "";
    }
}
